"""A finished job concluded by whoever settles its completion's write, not by its callback.

On a store that tells when a write is done (``update_then``: the batching
Firestore store), a callback whose handler returned does not wait for the
completion's write where nobody counts on its return meaning the message is
settled: the stock client at its default (no ``await_callbacks_on_shutdown``)
or a worker that drains its conclusions (``run()``). The thread that settles
the write then acks; a write that failed is settled and decided again on a
thread that may wait. Here on the in-memory store, the continuation held until
the test lets it go, on the test's thread, as the sending thread would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.continued import ContinuedStore, Then
from tests.support.world import SUB, FakeMessage, FakePublisher, FlakyStore

__all__ = ["ContinuedMemoryStore"]


class ContinuedMemoryStore(FlakyStore):
    """The in-memory store with ``update_then``: each continued update is held until ``go``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Callable[[], None]] = []
        self.continued = threading.Event()

    def update_then(
        self, doc_id: str, changes: s.Changes, *, expected: s.Version, then: Then
    ) -> None:
        def send() -> None:
            try:
                version = self.update(doc_id, changes, expected=expected)
            except Exception as exc:  # settled as update would have: the same error
                then(None, _raising(exc))
                return
            then(version, None)

        self.held.append(send)
        self.continued.set()

    def go(self) -> str:
        """Apply the held updates here; the name of the thread that did (the 'sender')."""
        while self.held:
            self.held.pop(0)()
        return threading.current_thread().name


def _raising(error: Exception) -> Callable[[], s.Version]:
    def settle() -> s.Version:
        raise error

    return settle


class _Manager:
    """A stock client's streaming pull manager, as far as the wrapper reads it."""

    def __init__(self, await_callbacks: bool) -> None:
        self._await_callbacks_on_shutdown = await_callbacks

    def eod(self) -> bool:
        return True


class _StreamMessage(FakeMessage):
    """A :class:`FakeMessage` from a stock client's stream; its ack's thread noted."""

    def __init__(self, *, await_callbacks: bool = False, op: str) -> None:
        super().__init__(op=op)
        self._exactly_once_delivery_enabled_func = _Manager(await_callbacks).eod
        self.acked_on = ""

    def ack_with_response(self) -> Future[Any]:
        self.acked_on = threading.current_thread().name
        return super().ack_with_response()


def _one_step(message: Any, job: pubsub_worker.Job) -> None:
    job.step("a", lambda: 1)


@pytest.fixture
def wrapped() -> Iterator[Callable[..., pubsub_worker.ExactlyOnce]]:
    made: list[pubsub_worker.ExactlyOnce] = []

    def make(
        store: FlakyStore, *, drains: bool = False, handler: Callable[..., Any] = _one_step
    ) -> pubsub_worker.ExactlyOnce:
        made.append(
            pubsub_worker.exactly_once(
                handler,
                settings=pubsub_worker.Settings(
                    subscription=SUB, key_attribute="op", lease_seconds=10, max_attempts=3
                ),
                store=store,
                publisher=FakePublisher(),
            )
        )
        made[-1].start(check_subscription=False, conclude_off_thread=drains)
        return made[-1]

    yield make
    for w in made:
        w.close()


def _status(store: FlakyStore, key: str) -> Any:
    snap = store.get(document_id(SUB, key))
    assert snap is not None
    return snap.fields["status"]


def test_the_in_memory_test_store_is_a_continued_store() -> None:
    assert isinstance(ContinuedMemoryStore(), ContinuedStore)


def test_the_callback_returns_before_the_completion_and_its_settler_acks(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce],
) -> None:
    store = ContinuedMemoryStore()
    worker = wrapped(store)
    message = _StreamMessage(op="k")
    callback = threading.Thread(target=worker, args=(message,), name="callback")
    callback.start()
    callback.join(10)
    assert not callback.is_alive()
    assert store.continued.is_set()  # the completion's write is under way, not waited for
    assert message.actions == []  # nothing acked before the record is durable
    assert _status(store, "k") == "running"
    assert worker.in_flight() == 1  # the delivery is watched until its conclusion
    assert not worker.wait_concluded(0.05)
    sender = store.go()
    assert message.outcome == "ack"
    assert message.acked_on == sender
    assert _status(store, "k") == "completed"
    assert worker.wait_concluded(5)
    assert worker.in_flight() == 0


@pytest.mark.parametrize("shape", ["awaits callbacks", "push"])
def test_a_callback_whose_return_counts_concludes_in_place(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce], shape: str
) -> None:
    """``await_callbacks_on_shutdown=True``, or a message from no stream (a push request's)."""
    store = ContinuedMemoryStore()
    worker = wrapped(store)
    message = (
        _StreamMessage(await_callbacks=True, op="k")
        if shape == "awaits callbacks"
        else FakeMessage(op="k")
    )
    worker(message)
    assert not store.continued.is_set()  # written with update(), on the callback thread
    assert message.outcome == "ack"
    assert _status(store, "k") == "completed"


def test_a_worker_that_drains_continues_any_message(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce],
) -> None:
    store = ContinuedMemoryStore()
    worker = wrapped(store, drains=True)
    message = FakeMessage(op="k")
    worker(message)
    assert store.continued.is_set()
    assert message.actions == []
    drained: list[bool] = []
    draining = threading.Thread(target=lambda: drained.append(worker.drain(10)))
    draining.start()
    draining.join(0.2)
    assert draining.is_alive()  # drain() waits for the conclusion under way
    store.go()
    draining.join(10)
    assert drained == [True]
    assert message.outcome == "ack"


def test_a_completion_refused_by_a_new_owner_is_decided_again_off_the_sender(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce],
) -> None:
    """Another owner took the job while the completion was in flight: never acked."""
    store = ContinuedMemoryStore()
    worker = wrapped(store)
    message = _StreamMessage(op="k")
    worker(message)
    doc_id = document_id(SUB, "k")
    snap = store.get(doc_id)
    assert snap is not None
    store.update(doc_id, {("epoch",): snap.fields["epoch"] + 1}, expected=snap.version)
    store.go()
    assert worker.wait_concluded(10)
    assert message.outcome == "nack"  # lost ownership, still the latest delivery: nacked
    assert message.acked_on == ""
    assert _status(store, "k") == "running"  # the new owner's record, untouched


def test_a_completion_the_store_failed_is_deferred_not_acked(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce],
) -> None:
    store = ContinuedMemoryStore()
    worker = wrapped(store)
    message = _StreamMessage(op="k")
    worker(message)
    store.fail["update"] = StoreError("Firestore update failed after 5 tries")
    store.go()
    assert worker.wait_concluded(10)
    assert message.outcome == "defer"
    assert _status(store, "k") == "running"
    assert worker.in_flight() == 0


def test_a_redelivery_waits_for_the_continued_completion_and_acks_from_the_record(
    wrapped: Callable[..., pubsub_worker.ExactlyOnce],
) -> None:
    runs: list[str] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        runs.append(job.step("a", lambda: "ran"))

    store = ContinuedMemoryStore()
    worker = wrapped(store, handler=handler)
    first = _StreamMessage(op="k")
    worker(first)
    again = _StreamMessage(op="k")
    second = threading.Thread(target=worker, args=(again,))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waits for the key, held until the first is concluded
    store.go()
    second.join(10)
    store.go()  # the second delivery writes nothing: the job is completed
    assert worker.wait_concluded(10)
    assert (first.outcome, again.outcome) == ("ack", "ack")
    assert runs == ["ran"]
