"""A batch held open for other jobs' writes while round trips are long, on the emulator.

The emulator answers in about a millisecond, so these stores call that
long (``slow_after_s`` well under it) and hold a batch open far longer than
the default ``gather_s``, so that timings on a loaded machine cannot blur
what is held and what is not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker.stores.batching import BatchingFirestoreJobStore
from tests.support.world import SUB, FakeMessage, FakePublisher

pytestmark = pytest.mark.emulator

_GATHER_S = 0.6


class _Batches:
    """Records each batch the store sends: its documents, and when it went."""

    def __init__(self, store: BatchingFirestoreJobStore) -> None:
        self.sent: list[tuple[float, list[str]]] = []
        self._send = store.batcher._send
        store.batcher._send = self  # type: ignore[method-assign]

    def __call__(self, batch: list[Any]) -> None:
        self.sent.append((time.monotonic(), [w.doc_path.rsplit("/", 1)[1] for w in batch]))
        self._send(batch)

    def docs(self) -> list[list[str]]:
        return [docs for _, docs in self.sent]


@pytest.fixture
def slow_store(
    firestore_client: Any, firestore_collection: str
) -> Iterator[BatchingFirestoreJobStore]:
    """A store whose round trips count as long, after one write to measure them."""
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, slow_after_s=1e-6, gather_s=_GATHER_S
    )
    store.create("first", {"epoch": 1})
    assert store.batcher.slots.round_trip_s > 1e-6
    yield store
    store.close()


def test_with_another_job_in_flight_a_write_waits_for_its_and_they_share_one_rpc(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    slow_store.batcher.slots.writers = lambda: 2
    batches = _Batches(slow_store)
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        first = pool.submit(slow_store.create, "a", {"epoch": 1})
        time.sleep(0.2)
        second = pool.submit(slow_store.create, "b", {"epoch": 1})
        first.result(timeout=10)
        second.result(timeout=10)
    assert batches.docs() == [["a", "b"]]
    # Held for "b"; once both jobs had their write queued it went, before gather_s passed.
    assert 0.2 <= batches.sent[0][0] - started < _GATHER_S - 0.1
    assert slow_store.get("a") is not None
    assert slow_store.get("b") is not None


def test_a_holding_flusher_is_not_woken_by_writes_until_the_last_one_ends_the_hold(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    """Each wake-up costs a context switch; the write that ends the hold goes on its own
    thread, with the held ones (no hand-off to the flusher)."""
    batcher = slow_store.batcher
    batcher.slots.writers = lambda: 4
    batcher.slots.arriving = lambda: 0  # no glance once every job has its write out
    senders: list[tuple[str, list[str]]] = []
    send = batcher._send

    def recorded(batch: list[Any]) -> None:
        senders.append(
            (threading.current_thread().name, [w.doc_path.rsplit("/", 1)[1] for w in batch])
        )
        send(batch)

    batcher._send = recorded  # type: ignore[method-assign]
    notified: list[str] = []
    notify = batcher._cond.notify

    def counted(n: int = 1) -> None:
        notified.append(threading.current_thread().name)
        notify(n)

    with ThreadPoolExecutor(4, thread_name_prefix="job") as pool:
        held = [pool.submit(slow_store.create, "a", {"epoch": 1})]
        deadline = time.monotonic() + 5
        while not batcher._holding:  # a flusher holds the batch open for the others
            assert time.monotonic() < deadline
            time.sleep(0.005)
        batcher._cond.notify = counted  # type: ignore[method-assign]
        held += [pool.submit(slow_store.create, doc, {"epoch": 1}) for doc in ("b", "c")]
        time.sleep(0.1)
        assert notified == []  # two writes queued, the flusher left asleep
        last = pool.submit(slow_store.create, "d", {"epoch": 1})
        for future in [*held, last]:
            future.result(timeout=10)
    assert len(senders) == 1
    sender, docs = senders[0]
    assert sorted(docs) == ["a", "b", "c", "d"]
    assert sender.startswith("job")  # the last job's thread, not a batch writer


def test_a_held_batch_goes_after_gather_s_when_nothing_joins_it(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    slow_store.batcher.slots.writers = lambda: 3
    batches = _Batches(slow_store)
    started = time.monotonic()
    slow_store.create("alone", {"epoch": 1})
    assert batches.docs() == [["alone"]]
    assert _GATHER_S <= batches.sent[0][0] - started < _GATHER_S + 1.0


def test_the_only_job_s_write_waits_a_glance_for_a_callback_about_to_start(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    slow_store.batcher.slots.writers = lambda: 1
    batches = _Batches(slow_store)
    started = time.monotonic()
    slow_store.create("only", {"epoch": 1})
    assert batches.docs() == [["only"]]
    assert _GATHER_S / 4 <= batches.sent[0][0] - started < _GATHER_S / 4 + 0.3


def test_the_only_job_s_claim_goes_at_once_when_no_message_waits_for_a_thread(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    """Under ``run()`` the worker knows: no message received waits for a thread."""
    slow_store.batcher.slots.writers = lambda: 1
    slow_store.batcher.slots.arriving = lambda: 0
    batches = _Batches(slow_store)
    started = time.monotonic()
    slow_store.create("only", {"epoch": 1})
    assert batches.docs() == [["only"]]
    assert batches.sent[0][0] - started < _GATHER_S / 4


def test_the_only_job_s_update_goes_at_once(slow_store: BatchingFirestoreJobStore) -> None:
    """A completion waits no glance: a callback about to start would only bring a claim."""
    slow_store.batcher.slots.writers = lambda: 1
    version = slow_store.get("first")
    assert version is not None
    batches = _Batches(slow_store)
    started = time.monotonic()
    slow_store.update("first", {("epoch",): 2}, expected=version.version)
    assert batches.docs() == [["first"]]
    assert batches.sent[0][0] - started < _GATHER_S / 4


def test_without_a_worker_a_write_goes_at_once_on_its_own_thread(
    slow_store: BatchingFirestoreJobStore,
) -> None:
    assert slow_store.batcher.slots.writers is None  # nobody said how many jobs there are
    senders: list[str] = []
    send = slow_store.batcher._send

    def recorded(batch: list[Any]) -> None:
        senders.append(threading.current_thread().name)
        send(batch)

    slow_store.batcher._send = recorded  # type: ignore[method-assign]
    started = time.monotonic()
    slow_store.create("lone", {"epoch": 1})
    assert time.monotonic() - started < _GATHER_S / 4
    assert senders == [threading.current_thread().name]  # no hand-off to a flusher


def test_a_worker_tells_its_batching_store_how_many_jobs_it_has(
    firestore_client: Any, firestore_collection: str
) -> None:
    """``exactly_once`` wires the store's slots to its deliveries in flight."""
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    seen: list[int] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        writers = store.batcher.slots.writers
        assert writers is not None
        seen.append(writers())

    wrapped = pubsub_worker.exactly_once(
        handler,
        settings=pubsub_worker.Settings(subscription=SUB, key_attribute="op"),
        store=store,
        publisher=FakePublisher().publish,
    )
    assert store.batcher.slots.writers is None  # not yet started
    wrapped.start(check_subscription=False)
    try:
        writers = store.batcher.slots.writers
        assert writers is not None
        assert writers() == 0
        message = FakeMessage(op="one")
        wrapped(message)
        assert message.outcome == "ack"
        assert seen == [1]  # this delivery, while its handler ran
        assert writers() == 0
    finally:
        wrapped.close()
        store.close()


def test_a_worker_that_hears_of_receipts_tells_its_store_how_many_wait_for_a_thread(
    firestore_client: Any, firestore_collection: str
) -> None:
    """``run()``'s scheduler reports each message as received (``wrapped.received``): the
    store then knows how many callbacks are about to start; a plain ``subscribe`` does not."""
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    wrapped = pubsub_worker.exactly_once(
        lambda message, job: None,
        settings=pubsub_worker.Settings(subscription=SUB, key_attribute="op"),
        store=store,
        publisher=FakePublisher().publish,
    )
    wrapped.start(check_subscription=False)
    try:
        arriving = store.batcher.slots.arriving
        assert arriving is not None
        assert arriving() is None  # no receipt reported yet: it cannot tell
        first, second = FakeMessage(op="one"), FakeMessage(op="two")
        wrapped.received(first)
        wrapped.received(second)
        assert arriving() == 2
        wrapped(first)
        assert first.outcome == "ack"
        assert arriving() == 1
        wrapped(second)
        assert arriving() == 0
    finally:
        wrapped.close()
        store.close()
