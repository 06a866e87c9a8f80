"""What batching adds on top of the store contract: shared RPCs, per-write outcomes, settlement.

The contract itself (create-if-absent, conditional update, one winner under
contention) runs on ``BatchingFirestoreJobStore`` in ``test_store_contract.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple, TypeVar

import pytest
from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.types import firestore as firestore_types

from emulator import Emulators, TcpProxy
from pubsub_worker._support.limits import MAX_BATCH_WRITE_BYTES
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import batching
from pubsub_worker.stores._batch_rpc import batch_write_call, request
from pubsub_worker.stores._writes import create_write, framed_bytes
from pubsub_worker.stores.base import AlreadyExists, Version, VersionConflict
from pubsub_worker.stores.batching import BatchingFirestoreJobStore

pytestmark = pytest.mark.emulator

T = TypeVar("T")


@pytest.fixture
def lingering(
    firestore_client: Any, firestore_collection: str
) -> Iterator[BatchingFirestoreJobStore]:
    """One batch in flight, held open 1 s: concurrent writes surely share one.

    200 ms once let one of ten threads, started late on a loaded machine,
    miss the batch.
    """
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=1, linger_s=1.0
    )
    yield store
    store.close()


def _together(calls: list[Callable[[], T]]) -> list[T | BaseException]:
    """Run the calls at once; each one's result or exception."""

    def run(call: Callable[[], T]) -> T | BaseException:
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_writes_share_one_rpc_and_get_their_own_versions(
    lingering: BatchingFirestoreJobStore,
) -> None:
    def create(i: int) -> Version:
        return lingering.create(f"job-{i}", {"epoch": 1, "n": i})

    results = _together([partial(create, i) for i in range(20)])
    assert lingering.batcher.writes == 20
    assert lingering.batcher.batches < 20
    for i, version in enumerate(results):
        snap = lingering.get(f"job-{i}")
        assert snap is not None
        assert snap.fields["n"] == i
        assert snap.version == version


def test_a_conflicting_create_fails_alone(lingering: BatchingFirestoreJobStore) -> None:
    lingering.create("taken", {"owner": "first"})
    before = lingering.batcher.batches
    calls: list[Callable[[], Version]] = [lambda: lingering.create("taken", {"owner": "second"})]

    def create(i: int) -> Version:
        return lingering.create(f"new-{i}", {"owner": "second"})

    calls += [partial(create, i) for i in range(9)]
    results = _together(calls)
    assert lingering.batcher.batches - before == 1  # all ten in one BatchWrite
    assert isinstance(results[0], AlreadyExists)
    assert not any(isinstance(r, BaseException) for r in results[1:])
    taken = lingering.get("taken")
    assert taken is not None
    assert taken.fields["owner"] == "first"
    for i in range(9):
        assert lingering.get(f"new-{i}") is not None


def test_a_stale_update_fails_alone(lingering: BatchingFirestoreJobStore) -> None:
    def create(i: int) -> Version:
        return lingering.create(f"job-{i}", {"epoch": 1})

    versions = _together([partial(create, i) for i in range(5)])
    assert not any(isinstance(v, BaseException) for v in versions)
    lingering.update("job-0", {("epoch",): 2}, expected=versions[0])  # job-0's v1 is now stale
    before = lingering.batcher.batches

    def update(i: int) -> Version:
        return lingering.update(f"job-{i}", {("epoch",): 3}, expected=versions[i])

    results = _together([partial(update, i) for i in range(5)])
    assert lingering.batcher.batches - before == 1
    assert isinstance(results[0], VersionConflict)
    assert not any(isinstance(r, BaseException) for r in results[1:])
    stale = lingering.get("job-0")
    assert stale is not None
    assert stale.fields["epoch"] == 2
    for i in range(1, 5):
        snap = lingering.get(f"job-{i}")
        assert snap is not None
        assert (snap.fields["epoch"], snap.version) == (3, results[i])


def test_writes_to_one_document_go_in_separate_batches(
    lingering: BatchingFirestoreJobStore,
) -> None:
    version = lingering.create("job", {"owner": "nobody"})
    before = lingering.batcher.batches

    def update(owner: str) -> Version:
        return lingering.update("job", {("owner",): owner}, expected=version)

    results = _together([partial(update, o) for o in "abcd"])
    assert lingering.batcher.batches - before == 4
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1


@pytest.mark.parametrize("operation", ["create", "update"])
def test_a_write_that_lands_after_its_settling_read_is_recognised_as_ours(
    lingering: BatchingFirestoreJobStore, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """Reply lost; the read that settles it runs before the write lands; the retry then fails.

    The retry's ``AlreadyExists``/``FailedPrecondition`` is our own first
    attempt: the caller gets that write's version, not a conflict.
    """
    version = lingering.create("other", {"epoch": 1})
    batcher = lingering.batcher
    real_submit, real_get = batcher.submit, lingering.get
    held: list[Any] = []

    def lose_reply(write_pb: Any, *, create: bool = False) -> Version:
        if not held:
            held.append(write_pb)  # sent, but slow: it lands after the next read
            raise gexc.DeadlineExceeded("reply lost")  # type: ignore[no-untyped-call]
        return real_submit(write_pb, create=create)

    def read_then_land(doc_id: str) -> Any:
        snap = real_get(doc_id)
        if held and held[0] is not None:
            real_submit(held[0])  # the late landing
            held[0] = None
        return snap

    monkeypatch.setattr(batcher, "submit", lose_reply)
    monkeypatch.setattr(lingering, "get", read_then_land)
    if operation == "create":
        result = lingering.create("job", {"epoch": 1})
    else:
        result = lingering.update("other", {("epoch",): 2}, expected=version)
    monkeypatch.undo()
    snap = lingering.get("job" if operation == "create" else "other")
    assert snap is not None
    assert snap.version == result
    assert snap.fields["epoch"] == (1 if operation == "create" else 2)


@pytest.mark.parametrize("operation", ["create", "update"])
def test_a_write_cut_off_by_a_partition_is_retried_and_applied_once(
    emulators: Emulators,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
    operation: str,
) -> None:
    """Every RPC times out while the partition lasts; healed, the write goes through.

    The caller gets the write's own version, never ``AlreadyExists`` or
    ``VersionConflict`` caused by itself.
    """
    from google.cloud import firestore

    assert emulators.firestore_host is not None
    with TcpProxy(emulators.firestore_host) as proxy:
        monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", proxy.address)
        client = firestore.Client(project=emulators.project)
        store = BatchingFirestoreJobStore(
            client, firestore_collection, rpc_timeout_s=0.5, retry_deadline_s=30.0
        )
        try:
            version = store.create("other", {"epoch": 1})  # the channel is up
            outcome: dict[str, Any] = {}

            def write() -> None:
                try:
                    if operation == "create":
                        outcome["version"] = store.create("job", {"epoch": 1})
                    else:
                        outcome["version"] = store.update(
                            "other", {("epoch",): 2}, expected=version
                        )
                except Exception as exc:
                    outcome["error"] = exc

            proxy.blackhole(True)
            thread = threading.Thread(target=write)
            thread.start()
            time.sleep(1.5)  # the write and the settling read time out, and are retried
            proxy.blackhole(False)  # held bytes go through: the first write lands late
            thread.join(timeout=30)
            assert not thread.is_alive()
            assert "error" not in outcome, outcome.get("error")
            snap = store.get("job" if operation == "create" else "other")
            assert snap is not None
            assert snap.fields["epoch"] == (1 if operation == "create" else 2)
            assert snap.version == outcome["version"]
        finally:
            store.close()
            client.close()  # type: ignore[no-untyped-call]


def test_an_idle_flusher_ends_and_the_next_write_starts_another(
    firestore_client: Any, firestore_collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "IDLE_EXIT_S", 0.2)
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=1
    )
    try:
        # One slot: writes that arrive while a batch is in flight wait for a flusher.
        _together([partial(store.create, f"one-{i}", {"epoch": 1}) for i in range(8)])
        assert store.batcher.batches < 8
        deadline = time.monotonic() + 5
        while store.batcher._flushers.threads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not store.batcher._flushers.threads
        store.create("two", {"epoch": 1})
        assert store.get("two") is not None
    finally:
        store.close()


def test_a_write_that_finds_a_slot_free_is_sent_by_its_own_thread(
    firestore_client: Any, firestore_collection: str
) -> None:
    """No hand-off to a flusher thread and back when nothing else is in flight."""
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    senders: list[str] = []
    send = store.batcher._send

    def recorded(batch: list[Any]) -> None:
        senders.append(threading.current_thread().name)
        send(batch)

    store.batcher._send = recorded  # type: ignore[method-assign]
    try:
        version = store.create("one", {"epoch": 1})
        store.update("one", {("epoch",): 2}, expected=version)
        assert senders == [threading.current_thread().name] * 2
        assert not store.batcher._flushers.threads  # no flusher was needed
        snap = store.get("one")
        assert snap is not None
        assert snap.fields["epoch"] == 2
    finally:
        store.close()


def test_a_closed_store_refuses_writes_at_once(
    firestore_client: Any, firestore_collection: str
) -> None:
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    store.create("one", {"epoch": 1})
    store.close()
    started = time.monotonic()
    with pytest.raises(StoreError, match="closed"):
        store.create("two", {"epoch": 1})
    assert time.monotonic() - started < 1.0  # not retried until the deadline


def test_two_flushers_with_a_linger_send_every_write_once_and_no_empty_batch(
    firestore_client: Any, firestore_collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=2, linger_s=0.01
    )
    sizes: list[int] = []
    send = store.batcher._send

    def recorded(batch: list[Any]) -> None:
        sizes.append(len(batch))
        send(batch)

    monkeypatch.setattr(store.batcher, "_send", recorded)

    def job(i: int) -> int:
        version = store.create(f"job-{i}", {"n": 0})
        for n in range(1, 4):
            version = store.update(f"job-{i}", {("n",): n}, expected=version)
        snap = store.get(f"job-{i}")
        assert snap is not None
        assert snap.version == version
        return int(snap.fields["n"])

    try:
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(job, range(32))) == [3] * 32
        assert sum(sizes) == 32 * 4
        assert min(sizes) >= 1
        assert len(sizes) < sum(sizes)
    finally:
        store.close()


class _CountingCondition(threading.Condition):
    """A condition that counts its ``notify`` calls."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def _one_slot_counting_notifies(
    client: Any, collection: str
) -> tuple[BatchingFirestoreJobStore, _CountingCondition]:
    """A store with one batch slot and no slow one, whose batcher counts its notifies."""
    store = BatchingFirestoreJobStore(client, collection, max_in_flight=1, slow_in_flight=1)
    store.batcher._cond = condition = _CountingCondition()
    return store, condition


def test_writes_queued_while_every_slot_is_busy_wake_no_flusher(
    firestore_client: Any, firestore_collection: str
) -> None:
    """A flusher woken with no slot free would find nothing to send: a freed slot wakes one."""
    store, condition = _one_slot_counting_notifies(firestore_client, firestore_collection)
    batcher = store.batcher
    first_sent, release = threading.Event(), threading.Event()
    send = batcher._send

    def held(batch: list[Any]) -> None:
        if not first_sent.is_set():
            first_sent.set()
            release.wait(10)  # the only slot stays busy
        send(batch)

    batcher._send = held  # type: ignore[method-assign]
    try:
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            assert first_sent.wait(10)
            queued = [pool.submit(store.create, f"queued-{i}", {"epoch": 1}) for i in range(5)]
            deadline = time.monotonic() + 10
            while len(batcher._queue) < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(batcher._queue) == 5
            assert condition.notified == 0  # five writes queued, no flusher woken for nothing
            release.set()
            for future in (first, *queued):
                future.result(timeout=20)
        assert 1 <= condition.notified <= 3  # the freed slot woke a flusher
        for name in ("first", *(f"queued-{i}" for i in range(5))):
            assert store.get(name) is not None
    finally:
        release.set()
        store.close()


def _gated_sends(batcher: Any) -> tuple[threading.Semaphore, list[str]]:
    """Gate the batcher's sends: each waits for a permit; the sending threads' names, in order."""
    permits = threading.Semaphore(0)
    senders: list[str] = []
    send = batcher._send

    def gated(batch: list[Any]) -> None:
        senders.append(threading.current_thread().name)
        assert permits.acquire(timeout=10)
        send(batch)

    batcher._send = gated
    return permits, senders


def test_a_flusher_that_frees_its_slot_sends_the_next_batch_itself_and_wakes_no_other(
    firestore_client: Any, firestore_collection: str
) -> None:
    """Its loop takes the next batch: a wake-up per batch would only be a futile switch."""
    store, condition = _one_slot_counting_notifies(firestore_client, firestore_collection)
    batcher = store.batcher
    permits, senders = _gated_sends(batcher)

    def sent(count: int) -> None:
        _wait_until(lambda: len(senders) == count, f"{count} batches sent")

    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(store.create, "a", {"epoch": 1})]
            sent(1)  # by the caller's thread: the slot was free
            futures.append(pool.submit(store.create, "b", {"epoch": 1}))
            _wait_until_queued(batcher, 1)
            permits.release()  # the caller's batch ends: it wakes the flusher for "b"
            sent(2)
            futures.append(pool.submit(store.create, "c", {"epoch": 1}))
            _wait_until_queued(batcher, 1)
            woken = condition.notified
            permits.release()  # the flusher's batch ends, "c" queued behind it
            sent(3)
            assert condition.notified == woken  # the flusher took "c" itself, woke none
            assert senders[2] == senders[1] != senders[0]
            permits.release()
            for future in futures:
                future.result(timeout=20)
        for name in "abc":
            assert store.get(name) is not None
    finally:
        for _ in range(3):
            permits.release()
        store.close()


def test_a_flusher_held_in_a_continuation_leaves_the_next_batch_to_another_flusher(
    firestore_client: Any, firestore_collection: str
) -> None:
    """A completion's continuation that blocks (a slow hook) holds up no other job's write.

    One slot and one flusher at most: the flusher that sent a completion runs
    its continuation, which blocks; the claim queued behind it is sent by a
    flusher started for it, and its caller answered, while the continuation
    still blocks.
    """
    store, _ = _one_slot_counting_notifies(firestore_client, firestore_collection)
    batcher = store.batcher
    version = store.create("done", {"epoch": 1})
    permits, senders = _gated_sends(batcher)

    held, go = threading.Event(), threading.Event()
    outcomes: list[Version | None] = []

    def blocking_hook(applied: Version | None, settle: Any) -> None:
        outcomes.append(applied)
        held.set()
        go.wait(30)

    try:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            _wait_until(lambda: len(senders) == 1, "the first batch sent")
            store.update_then(
                "done", {("state",): "completed"}, expected=version, then=blocking_hook
            )
            _wait_until_queued(batcher, 1)
            permits.release()  # the caller's batch ends; the flusher sends the completion
            _wait_until(lambda: len(senders) == 2, "the completion sent")
            claim = pool.submit(store.create, "claim", {"epoch": 1})
            _wait_until_queued(batcher, 1)
            permits.release()  # the completion is answered: its flusher carries on, and blocks
            assert held.wait(10)
            permits.release()
            assert claim.result(timeout=10) is not None  # sent while the continuation blocks
            assert not go.is_set()
            assert senders[2] != senders[1]
            assert first.result(timeout=10) is not None
        assert len(outcomes) == 1
        assert outcomes[0] is not None  # the completion applied
        assert store.get("claim") is not None
    finally:
        go.set()
        for _ in range(3):
            permits.release()
        store.close()


def test_a_claim_sent_with_another_jobs_completion_leaves_its_continuation_to_a_flusher(
    firestore_client: Any, firestore_collection: str
) -> None:
    """A job's thread that sends other jobs' writes with its own never runs their conclusions.

    A completion is held open for the worker's other jobs (long round trips,
    two jobs in flight); the other job's claim ends the hold and its thread
    sends both. The completion's continuation blocks (a slow hook): it runs
    on a flusher, and the claim's caller goes on meanwhile.
    """
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, slow_after_s=1e-6, gather_s=5.0
    )
    batcher = store.batcher
    version = store.create("done", {"epoch": 1})  # a round trip: round trips count as long
    batcher.slots.writers = lambda: 2  # two jobs in flight
    batcher.slots.arriving = lambda: 0  # no callback about to start
    held, go = threading.Event(), threading.Event()
    carried_on: list[str] = []
    batch_sizes: list[int] = []
    send = batcher._send

    def recorded(batch: list[Any]) -> None:
        batch_sizes.append(len(batch))
        send(batch)

    def blocking_hook(applied: Version | None, settle: Any) -> None:
        carried_on.append(threading.current_thread().name)
        held.set()
        go.wait(30)

    batcher._send = recorded  # type: ignore[method-assign]
    try:
        store.update_then("done", {("state",): "completed"}, expected=version, then=blocking_hook)
        _wait_until_queued(batcher, 1)  # held open for the other job's write
        with ThreadPoolExecutor(1, thread_name_prefix="callback") as pool:
            claim = pool.submit(store.create, "claim", {"epoch": 1})
            assert claim.result(timeout=10) is not None  # not held by the completion's hook
        assert held.wait(10)
        assert not go.is_set()
        assert batch_sizes == [2]  # one RPC: the claim's thread sent both
        assert carried_on[0].startswith("pubsub-worker-batch-writer")
    finally:
        go.set()
        store.close()


class _HeldSends:
    """Replaces a batcher's ``_send``: records when each batch went, holds each until released."""

    def __init__(self, batcher: Any) -> None:
        self._send = batcher._send
        self.sent_at: list[float] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        batcher._send = self

    def __call__(self, batch: list[Any]) -> None:
        with self._lock:
            self.sent_at.append(time.monotonic())
        self.release.wait(10)
        self._send(batch)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.sent_at) < count:
            assert time.monotonic() < deadline, f"{len(self.sent_at)} of {count} batches sent"
            time.sleep(0.005)


def test_a_slow_batch_in_flight_opens_one_more_slot_after_slow_after_s_up_to_slow_in_flight(
    firestore_client: Any, firestore_collection: str
) -> None:
    """At long round trips a write waits ``slow_after_s`` for a slot, not a whole round trip."""
    store = BatchingFirestoreJobStore(
        firestore_client,
        firestore_collection,
        max_in_flight=1,
        slow_in_flight=3,
        slow_after_s=1.0,
    )
    held = _HeldSends(store.batcher)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(store.create, "w0", {"epoch": 1})]
            held.wait_for(1)
            futures.append(pool.submit(store.create, "w1", {"epoch": 1}))
            time.sleep(0.3)
            assert len(held.sent_at) == 1  # the one slot busy, its batch not slow yet
            held.wait_for(2)
            futures.append(pool.submit(store.create, "w2", {"epoch": 1}))
            held.wait_for(3)
            # Each slow slot opened once the youngest batch in flight had been out 1 s.
            assert held.sent_at[1] - held.sent_at[0] >= 1.0
            assert held.sent_at[2] - held.sent_at[1] >= 1.0
            futures.append(pool.submit(store.create, "w3", {"epoch": 1}))
            time.sleep(1.5)
            assert len(held.sent_at) == 3  # slow_in_flight: no fourth batch, however slow
            held.release.set()
            for future in futures:
                future.result(timeout=20)
        assert store.batcher.batches == 4
        for i in range(4):
            assert store.get(f"w{i}") is not None
    finally:
        held.release.set()
        store.close()


def _long_round_trips_store(
    client: Any, collection: str, *, slow_after_s: float, long_wait_s: float
) -> BatchingFirestoreJobStore:
    """A store with one slot and one slow slot, whose batches' round trips are long (2 s)."""
    store = BatchingFirestoreJobStore(
        client,
        collection,
        max_in_flight=1,
        slow_in_flight=2,
        slow_after_s=slow_after_s,
        long_wait_s=long_wait_s,
    )
    store.batcher.slots.take(time.monotonic())
    store.batcher.slots.give_back(2.0)
    return store


def _second_batch_after(
    store: BatchingFirestoreJobStore, docs: tuple[str, str], **wait: float
) -> float:
    """Create ``docs`` one after another, the first's batch held in flight: seconds from the
    first batch sent to the second (``wait``: :meth:`_HeldSends.wait_for`'s timeout)."""
    held = _HeldSends(store.batcher)
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(store.create, docs[0], {"epoch": 1})]
            held.wait_for(1)
            futures.append(pool.submit(store.create, docs[1], {"epoch": 1}))
            held.wait_for(2, **wait)
            gap = held.sent_at[1] - held.sent_at[0]
            held.release.set()
            for future in futures:
                future.result(timeout=20)
        return gap
    finally:
        held.release.set()


def test_while_round_trips_are_long_a_slow_slot_opens_after_long_wait_s(
    firestore_client: Any, firestore_collection: str
) -> None:
    """While the batches' round trips average ``slow_after_s`` or more, a write waits
    ``long_wait_s`` for a slot, not ``slow_after_s``."""
    store = _long_round_trips_store(
        firestore_client, firestore_collection, slow_after_s=1.0, long_wait_s=0.2
    )
    try:
        # sent before slow_after_s would have opened the slot
        assert _second_batch_after(store, ("l0", "l1"), timeout_s=0.9) >= 0.2
        assert store.get("l0") is not None
        assert store.get("l1") is not None
    finally:
        store.close()


def test_at_long_round_trips_a_write_waits_slow_after_s_while_a_job_may_add_one(
    firestore_client: Any, firestore_collection: str
) -> None:
    """A job in flight without a write out may add one to the waiting batch: the slow
    slot opens after ``slow_after_s`` then, not ``long_wait_s``, as under a backlog."""
    store = _long_round_trips_store(
        firestore_client, firestore_collection, slow_after_s=0.6, long_wait_s=0.1
    )
    store.batcher.slots.writers = lambda: 3  # three jobs in flight: the third has no write out
    try:
        assert _second_batch_after(store, ("m0", "m1")) >= 0.6
        assert store.get("m1") is not None
    finally:
        store.close()


def test_writes_waiting_for_a_slow_slot_wake_one_flusher_and_no_more(
    firestore_client: Any, firestore_collection: str
) -> None:
    """Once a flusher waits for the slow slot to open, later writes wake nobody."""
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=2, slow_after_s=5.0
    )
    batcher = store.batcher
    batcher._cond = condition = _CountingCondition()
    held = _HeldSends(batcher)

    def until(check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    try:
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            held.wait_for(1)
            queued = [pool.submit(store.create, "queued-0", {"epoch": 1})]
            until(lambda: batcher._timed)  # a flusher waits for the slow slot to open
            woken = condition.notified
            assert woken >= 1
            queued += [pool.submit(store.create, f"queued-{i}", {"epoch": 1}) for i in range(1, 5)]
            until(lambda: len(batcher._queue) == 5)
            assert condition.notified == woken  # four more writes, no flusher woken for them
            assert len(held.sent_at) == 1  # and none sent: the slot opens after 5 s
            held.release.set()
            for future in (first, *queued):
                future.result(timeout=20)
        assert len(held.sent_at) <= 3
    finally:
        held.release.set()
        store.close()


def test_slow_slots_are_refused_a_non_positive_wait(firestore_client: Any) -> None:
    with pytest.raises(ValueError, match="slow_after_s"):
        batching.WriteBatcher(firestore_client, slow_after_s=0)


def test_batch_write_sends_the_metadata_of_the_generated_client(firestore_client: Any) -> None:
    """The raw request carries what the generated client adds: prefix, routing, client info."""
    _, metadata = batch_write_call(firestore_client)
    headers = dict(metadata)
    database = firestore_client._database_string
    assert headers["google-cloud-resource-prefix"] == database
    assert headers["x-goog-request-params"] == "database=" + database.replace("(", "%28").replace(
        ")", "%29"
    )
    assert "gccl/" in headers["x-goog-api-client"]


# -- the byte cap -------------------------------------------------------------------------


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _wait_until_queued(batcher: batching.WriteBatcher, count: int) -> None:
    _wait_until(lambda: len(batcher._queue) == count, f"{count} writes are queued")


class _Recorded(NamedTuple):
    sent: list[tuple[int, list[str]]]
    """Every request sent: its serialized bytes, its documents' ids."""
    released: threading.Event
    """Set once the first request has seen every write it waited for queued."""


def _recorded_requests(
    batcher: batching.WriteBatcher, monkeypatch: pytest.MonkeyPatch, *, held_until_queued: int
) -> _Recorded:
    """Every ``BatchWrite`` request the batcher sends: its serialized bytes, its documents' ids.

    The first request is held until ``held_until_queued`` writes wait behind it,
    so that (one batch in flight) they are all queued when it is answered.
    """
    recorded = _Recorded([], threading.Event())
    call = batcher._call

    def record(request: bytes, **kwargs: Any) -> Any:
        writes = firestore_types.BatchWriteRequest.pb().FromString(request).writes
        recorded.sent.append((len(request), [w.update.name.rsplit("/", 1)[1] for w in writes]))
        if len(recorded.sent) == 1:
            _wait_until_queued(batcher, held_until_queued)
            recorded.released.set()
        return call(request, **kwargs)

    monkeypatch.setattr(batcher, "_call", record)
    return recorded


def _queue_in_order(
    pool: ThreadPoolExecutor,
    batcher: batching.WriteBatcher,
    calls: Sequence[Callable[[], T]],
    recorded: _Recorded,
) -> list[Future[T]]:
    """Start the calls one at a time, each once the one before is queued (a known order).

    Nothing leaves the queue while the first request is held, so each count
    is exact until the last write is queued; then the held request goes and
    the queue drains at once, so the last wait also ends on its release (a
    check of the count alone can miss the moment it was reached).
    """

    def queued_or_released(count: int) -> Callable[[], bool]:
        return lambda: len(batcher._queue) == count or recorded.released.is_set()

    futures: list[Future[T]] = []
    for call in calls:
        queued = len(batcher._queue) + 1
        futures.append(pool.submit(call))
        _wait_until(queued_or_released(queued), f"{queued} writes are queued")
    return futures


def test_queued_writes_over_the_byte_cap_are_split_across_requests_each_under_it(
    firestore_client: Any, firestore_collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 writes of 250 KiB (5.1 MB) queued behind one in flight: no request over the cap."""
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=1
    )
    queued = 20
    sent = _recorded_requests(store.batcher, monkeypatch, held_until_queued=queued).sent
    result = "r" * (250 * 1024)
    try:
        with ThreadPoolExecutor(queued + 1) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            _wait_until(lambda: len(sent) == 1, "the first write sent")
            jobs = [
                pool.submit(store.create, f"job-{i}", {"epoch": 1, "steps": {"s": result}})
                for i in range(queued)
            ]
            versions = [job.result(timeout=60) for job in jobs]
            first.result(timeout=60)
        assert max(size for size, _ in sent) <= MAX_BATCH_WRITE_BYTES
        # The first alone; then 15 writes of 256,1xx bytes fill 4 MB, and 5 remain.
        assert [len(ids) for _, ids in sent] == [1, 15, 5]
        assert sorted(i for _, ids in sent for i in ids) == sorted(
            ["first", *(f"job-{i}" for i in range(queued))]
        )
        for i, version in enumerate(versions):
            snap = store.get(f"job-{i}")
            assert snap is not None
            assert snap.version == version
            assert snap.fields["steps"] == {"s": result}
    finally:
        store.close()


def test_a_write_over_the_byte_cap_goes_alone_and_keeps_its_place(
    firestore_client: Any, firestore_collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that fit go on without it; it goes next, alone; those that did not fit follow."""
    cap = 64 * 1024
    store = BatchingFirestoreJobStore(
        firestore_client,
        firestore_collection,
        max_in_flight=1,
        slow_in_flight=1,
        max_batch_bytes=cap,
    )
    small, big = "s" * 10_000, "b" * 100_000
    names = ["a0", "a1", "a2", "a3", "big", "b0", "b1", "b2", "b3"]
    recorded = _recorded_requests(store.batcher, monkeypatch, held_until_queued=len(names))
    sent = recorded.sent
    try:
        with ThreadPoolExecutor(len(names) + 1) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            _wait_until(lambda: len(sent) == 1, "the first write sent")
            calls = [
                partial(store.create, name, {"data": big if name == "big" else small})
                for name in names
            ]
            futures = _queue_in_order(pool, store.batcher, calls, recorded)
            versions = [future.result(timeout=30) for future in futures]
            first.result(timeout=30)
        # Six writes of 10 kB fit 64 KiB; the big one goes next, alone; then the last two.
        assert [ids for _, ids in sent] == [
            ["first"],
            ["a0", "a1", "a2", "a3", "b0", "b1"],
            ["big"],
            ["b2", "b3"],
        ]
        assert [size <= cap for size, _ in sent] == [True, True, False, True]
        for name, version in zip(names, versions, strict=True):
            snap = store.get(name)
            assert snap is not None
            assert snap.version == version
            assert snap.fields["data"] == (big if name == "big" else small)
    finally:
        store.close()


def test_a_write_left_for_its_size_is_not_overtaken_by_a_later_write_to_its_document(
    firestore_client: Any, firestore_collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two creates of one document: the first queued wins, though it waited for room."""
    store = BatchingFirestoreJobStore(
        firestore_client,
        firestore_collection,
        max_in_flight=1,
        slow_in_flight=1,
        max_batch_bytes=64 * 1024,
    )
    recorded = _recorded_requests(store.batcher, monkeypatch, held_until_queued=3)
    sent = recorded.sent
    try:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(store.create, "first", {"epoch": 1})
            _wait_until(lambda: len(sent) == 1, "the first write sent")
            calls: list[Callable[[], Version]] = [
                partial(store.create, "filler", {"data": "f" * 40_000}),
                partial(store.create, "job", {"owner": "early", "data": "e" * 40_000}),
                partial(store.create, "job", {"owner": "late"}),
            ]
            filler, early, late = _queue_in_order(pool, store.batcher, calls, recorded)
            version = early.result(timeout=30)
            with pytest.raises(AlreadyExists):
                late.result(timeout=30)
            filler.result(timeout=30)
            first.result(timeout=30)
        assert [ids for _, ids in sent] == [["first"], ["filler"], ["job"], ["job"]]
        snap = store.get("job")
        assert snap is not None
        assert (snap.fields["owner"], snap.version) == ("early", version)
    finally:
        store.close()


def test_the_request_is_the_writes_framed_as_the_byte_cap_counts_them() -> None:
    """The request framed from serialized writes parses back to them, and its size is the
    database field plus each write framed (what the cap counts), across varint widths."""
    request_type = firestore_types.BatchWriteRequest.pb()
    database = "projects/p/databases/(default)"
    writes = [
        create_write(f"{database}/documents/c/d", {"s": "x" * length})
        for length in (*range(0, 200), *range(16_250, 16_400), *range(2_097_030, 2_097_170, 7))
    ]
    sizes = {w.ByteSize() for w in writes}
    assert {127, 128, 16_383, 16_384, 2_097_151, 2_097_152} & sizes  # widths 1 to 4 covered
    for write in writes:
        data = write.SerializeToString()
        sent = request(database, [data, data])
        assert len(sent) == framed_bytes(len(database)) + 2 * framed_bytes(len(data))
        assert sent == request_type(database=database, writes=[write, write]).SerializeToString()
    parsed = request_type.FromString(request(database, [w.SerializeToString() for w in writes]))
    assert (parsed.database, list(parsed.writes)) == (database, writes)


def test_a_byte_cap_over_productions_limit_is_refused(firestore_client: Any) -> None:
    for cap in (0, MAX_BATCH_WRITE_BYTES + 1):
        with pytest.raises(ValueError, match="max_batch_bytes"):
            batching.WriteBatcher(firestore_client, max_batch_bytes=cap)


def test_by_default_one_batch_flies_and_the_writes_behind_it_share_the_next(
    firestore_client: Any, firestore_collection: str
) -> None:
    """The default: one batch at a time while RPCs are fast (a slow one opens more, above)."""
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection, slow_after_s=30.0)
    held = _HeldSends(store.batcher)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(store.create, "d0", {"epoch": 1})]
            held.wait_for(1)
            futures += [pool.submit(store.create, f"d{i}", {"epoch": 1}) for i in (1, 2, 3)]
            time.sleep(0.3)
            assert len(held.sent_at) == 1  # no second batch beside the first
            held.release.set()
            for future in futures:
                future.result(timeout=20)
        assert (store.batcher.batches, store.batcher.writes) == (2, 4)  # three shared one
    finally:
        held.release.set()
        store.close()
