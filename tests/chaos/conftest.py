"""Fixtures for crash-window tests: real worker processes on a fresh topic and collection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from tests.support.processes import Effects, Worker, start_worker, stop_all

LEASE_S = 10


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.jsonl")


@pytest.fixture
def worker_env(
    emulators: Emulators,
    eod_subscription: SubscriptionHandle,
    firestore_collection: str,
    effects: Effects,
) -> dict[str, str]:
    """Environment of a worker on this test's subscription, with a 10 s lease."""
    return {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": eod_subscription.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "op",
        "PUBSUB_WORKER_LEASE_SECONDS": str(LEASE_S),
        "PUBSUB_WORKER_MAX_PROCESSING_SECONDS": "120",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "5",
        "CHAOS_EFFECTS": str(effects.path),
    }


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Any]:
    """``workers(env, name)`` starts a worker; all are killed at the end of the test."""
    started: list[Worker] = []

    def start(env: dict[str, str], name: str = "worker") -> Worker:
        worker = start_worker(env, tmp_path / f"{name}-{len(started)}.log", name)
        started.append(worker)
        return worker

    yield start
    stop_all(started)
