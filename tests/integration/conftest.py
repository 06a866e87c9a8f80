"""In-process workers against the real emulators."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import pubsub_worker
from emulator import Emulators, SubscriptionHandle, drain_messages
from pubsub_worker._delivery import acks


@pytest.fixture(autouse=True)
def production_acks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acks go straight to Pub/Sub, as at production's round trips (see
    :func:`tests.support.production.production_acks`, which the worker processes
    call); a test of the fast-network path sets ``SLOW_AFTER_S`` back."""
    monkeypatch.setattr(acks, "SLOW_AFTER_S", 0.0)


class RunningWorker:
    """A ``pubsub_worker.run`` loop in a thread; ``stop()`` ends it like SIGTERM would."""

    def __init__(self, wrapped: pubsub_worker.ExactlyOnce, settings: pubsub_worker.Settings):
        self.wrapped = wrapped
        self.settings = settings
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            pubsub_worker.run(self.wrapped, settings=self.settings, stop=self.stop_event)
        except BaseException as exc:
            self.error = exc

    def counter(self, counter: pubsub_worker.Counter) -> int:
        return self.wrapped.metrics.get(counter)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.error is not None:
                raise AssertionError(f"worker failed: {self.error!r}") from self.error
            time.sleep(0.05)
        raise AssertionError(
            f"condition not met in {timeout_s} s: {self.wrapped.metrics.snapshot()}"
        )

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "worker did not stop"


@pytest.fixture
def settings_for(
    emulators: Emulators, firestore_collection: str
) -> Callable[..., pubsub_worker.Settings]:
    """Settings for a subscription, on this test's collection, with a short lease."""

    def make(subscription: SubscriptionHandle, **overrides: Any) -> pubsub_worker.Settings:
        values: dict[str, Any] = {
            "subscription": subscription.subscription_path,
            "collection": firestore_collection,
            "lease_seconds": 10,
            "max_processing_seconds": 60,
            "shutdown_grace_seconds": 2,
            "ack_timeout_seconds": 10,
        }
        values.update(overrides)
        return pubsub_worker.Settings(**values)

    return make


@pytest.fixture
def worker(emulators: Emulators) -> Callable[..., Any]:
    """``with worker(handler, settings) as w:`` runs a worker for the block."""
    del emulators

    @contextmanager
    def start(handler: Any, settings: pubsub_worker.Settings) -> Iterator[RunningWorker]:
        wrapped = (
            handler
            if isinstance(handler, pubsub_worker.ExactlyOnce)
            else pubsub_worker.exactly_once(handler, settings=settings)
        )
        running = RunningWorker(wrapped, settings)
        running.thread.start()
        try:
            yield running
        finally:
            running.stop()

    return start


pull_all = drain_messages
"""Pull (and ack) everything on a subscription until it stays quiet (1.5 s by default)."""
