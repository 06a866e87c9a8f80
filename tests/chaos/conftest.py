"""Fixtures for crash-window tests: real worker processes on a fresh topic and collection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from tests.support.processes import Effects, Worker, start_worker, stop_all

LEASE_S = 10

BOTH_FLAVOURS = pytest.mark.parametrize("handler_flavour", ["sync", "async"], indirect=True)
"""Run a crash-window test with a sync handler and with the same ``async def`` handler."""


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.jsonl")


@pytest.fixture
def handler_flavour(request: pytest.FixtureRequest) -> str:
    """``sync`` unless a test is parametrized over ``["sync", "async"]`` (indirect)."""
    return str(getattr(request, "param", "sync"))


@pytest.fixture
def worker_env(
    handler_flavour: str,
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
        "CHAOS_ASYNC": "1" if handler_flavour == "async" else "",
    }


@pytest.fixture
def workers(tmp_path: Path, handler_flavour: str, effects: Effects) -> Iterator[Any]:
    """``workers(env, name)`` starts a worker; all are killed at the end of the test.

    A test run with the ``async`` flavour checks at the end that every effect
    came from the ``async def`` handlers.
    """
    started: list[Worker] = []

    def start(env: dict[str, str], name: str = "worker") -> Worker:
        worker = start_worker(env, tmp_path / f"{name}-{len(started)}.log", name)
        started.append(worker)
        return worker

    yield start
    stop_all(started)
    if handler_flavour == "async":
        flavours = {e.get("flavour") for e in effects.read() if e["effect"] != "killed"}
        assert flavours == {"async"}, f"effects from {flavours}, not only the async handlers"
