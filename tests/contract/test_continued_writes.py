"""``update_then`` of the batching store: an update's outcome handed on, nobody waiting for it.

The worker concludes a finished job this way: the thread that settles the
completion's write acks (``docs/architecture.md``, "Conclusions"). What it
counts on, on the Firestore emulator: the continuation is called once, with
the version ``update`` would return, after the batch's slot is given back; a
refused or unknown outcome comes as a ``settle`` that goes on as ``update``
would (a conflict, a reply lost and the write landed); a continuation that
raises harms no other write.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from emulator import Emulators
from pubsub_worker.errors import StoreError
from pubsub_worker.stores.base import Version, VersionConflict
from pubsub_worker.stores.batching import BatchingFirestoreJobStore
from pubsub_worker.stores.continued import ContinuedStore, Settle

pytestmark = pytest.mark.emulator


class _Outcome:
    """What one ``then`` was called with, where, and what the batcher looked like then."""

    def __init__(self, store: BatchingFirestoreJobStore) -> None:
        self._store = store
        self.calls: list[tuple[Version | None, Settle | None]] = []
        self.thread = ""
        self.doc_busy: bool | None = None
        self.done = threading.Event()

    def __call__(self, version: Version | None, settle: Settle | None) -> None:
        self.calls.append((version, settle))
        self.thread = threading.current_thread().name
        with self._store.batcher._cond:
            self.doc_busy = bool(self._store.batcher._queue.busy)
        self.done.set()

    def one(self) -> tuple[Version | None, Settle | None]:
        assert self.done.wait(10)
        time.sleep(0.05)  # a second call would come now
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


@pytest.fixture
def store(firestore_client: Any, firestore_collection: str) -> Iterator[BatchingFirestoreJobStore]:
    made = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    yield made
    made.close()


def test_the_batching_store_is_a_continued_store(store: BatchingFirestoreJobStore) -> None:
    assert isinstance(store, ContinuedStore)


def test_an_applied_update_hands_on_its_version_on_the_sending_thread_with_its_slot_free(
    store: BatchingFirestoreJobStore,
) -> None:
    version = store.create("job", {"epoch": 1})
    outcome = _Outcome(store)
    store.update_then("job", {("epoch",): 2}, expected=version, then=outcome)
    # Nothing else in flight: this thread sent the batch, and carried on before returning.
    assert outcome.done.is_set()
    new, settle = outcome.one()
    assert settle is None
    assert outcome.thread == threading.current_thread().name
    assert outcome.doc_busy is False
    snap = store.get("job")
    assert snap is not None
    assert (snap.fields["epoch"], snap.version) == (2, new)


def test_an_update_behind_a_batch_in_flight_returns_at_once_and_its_sender_carries_on(
    firestore_client: Any, firestore_collection: str
) -> None:
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=1
    )
    try:
        version = store.create("job", {"epoch": 1})
        send, release = store.batcher._send, threading.Event()

        def held(batch: list[Any]) -> None:
            if not release.is_set():
                assert release.wait(10)
            send(batch)

        store.batcher._send = held  # type: ignore[method-assign]
        first = threading.Thread(target=store.create, args=("other", {"epoch": 1}))
        first.start()  # takes the one slot, held
        deadline = time.monotonic() + 5
        while not store.batcher._queue.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        outcome = _Outcome(store)
        store.update_then("job", {("epoch",): 2}, expected=version, then=outcome)
        assert not outcome.done.is_set()  # queued behind the held batch: nobody waits
        release.set()
        new, settle = outcome.one()
        first.join(10)
        assert settle is None
        assert outcome.thread.startswith("pubsub-worker-batch-writer")
        assert outcome.doc_busy is False
        snap = store.get("job")
        assert snap is not None
        assert (snap.fields["epoch"], snap.version) == (2, new)
    finally:
        store.close()


def test_a_stale_update_hands_on_a_settle_that_raises_the_conflict(
    store: BatchingFirestoreJobStore,
) -> None:
    version = store.create("job", {"epoch": 1})
    store.update("job", {("epoch",): 2}, expected=version)  # version is stale now
    outcome = _Outcome(store)
    store.update_then("job", {("epoch",): 3}, expected=version, then=outcome)
    new, settle = outcome.one()
    assert new is None
    assert settle is not None
    with pytest.raises(VersionConflict):
        settle()
    snap = store.get("job")
    assert snap is not None
    assert snap.fields["epoch"] == 2


def test_an_update_whose_reply_was_lost_is_settled_as_landed(
    store: BatchingFirestoreJobStore,
) -> None:
    """Applied, its answer lost: ``settle`` reads the document back, finds its write id."""
    version = store.create("job", {"epoch": 1})
    send = store.batcher._send

    def reply_lost(batch: list[Any]) -> None:
        send(batch)
        for write in batch:
            write.settled = False
            write.settle(None, gexc.DeadlineExceeded("reply lost"))  # type: ignore[no-untyped-call]

    store.batcher._send = reply_lost  # type: ignore[method-assign]
    outcome = _Outcome(store)
    store.update_then("job", {("epoch",): 2}, expected=version, then=outcome)
    new, settle = outcome.one()
    assert new is None
    assert settle is not None
    store.batcher._send = send  # type: ignore[method-assign]
    landed = settle()
    snap = store.get("job")
    assert snap is not None
    assert (snap.fields["epoch"], snap.version) == (2, landed)
    assert store.batcher.writes == 2  # the create and the update, once: nothing sent again


def test_an_unapplied_update_is_sent_again_by_its_settle(
    store: BatchingFirestoreJobStore,
) -> None:
    """Refused as unavailable before it was applied: ``settle`` sends it again, once."""
    version = store.create("job", {"epoch": 1})
    send = store.batcher._send

    def refused(batch: list[Any]) -> None:
        for write in batch:
            write.settle(None, gexc.ServiceUnavailable("try again"))  # type: ignore[no-untyped-call]

    store.batcher._send = refused  # type: ignore[method-assign]
    outcome = _Outcome(store)
    store.update_then("job", {("epoch",): 2}, expected=version, then=outcome)
    new, settle = outcome.one()
    assert new is None
    assert settle is not None
    unapplied = store.get("job")
    assert unapplied is not None
    assert unapplied.fields["epoch"] == 1
    store.batcher._send = send  # type: ignore[method-assign]
    landed = settle()
    snap = store.get("job")
    assert snap is not None
    assert (snap.fields["epoch"], snap.version) == (2, landed)


def test_a_continuation_that_raises_harms_no_other_write(
    firestore_client: Any, firestore_collection: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = BatchingFirestoreJobStore(
        firestore_client, firestore_collection, max_in_flight=1, slow_in_flight=1, linger_s=0.5
    )
    try:
        versions = [store.create(f"job-{i}", {"epoch": 1}) for i in range(2)]

        def broken(version: Version | None, settle: Settle | None) -> None:
            raise RuntimeError("a broken continuation")

        outcome = _Outcome(store)
        store.update_then("job-0", {("epoch",): 2}, expected=versions[0], then=broken)
        store.update_then("job-1", {("epoch",): 2}, expected=versions[1], then=outcome)
        new, settle = outcome.one()  # the same lingering batch, carried on after the broken one
        assert settle is None
        assert new is not None
        assert "a write's continuation failed" in caplog.text
        snap = store.get("job-0")
        assert snap is not None
        assert snap.fields["epoch"] == 2  # the broken continuation's write applied all the same
        store.update("job-0", {("epoch",): 3}, expected=snap.version)  # and the store goes on
    finally:
        store.close()


def test_a_closed_store_refuses_at_once_and_calls_nothing(
    firestore_client: Any, firestore_collection: str
) -> None:
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    version = store.create("job", {"epoch": 1})
    store.close()
    outcome = _Outcome(store)
    with pytest.raises(StoreError):
        store.update_then("job", {("epoch",): 2}, expected=version, then=outcome)
    time.sleep(0.05)
    assert not outcome.calls


_EXITS_WITH_A_WRITE_QUEUED = """
import sys
from google.cloud import firestore
from pubsub_worker.stores.batching import BatchingFirestoreJobStore

client = firestore.Client(project=sys.argv[1])
store = BatchingFirestoreJobStore(client, sys.argv[2], linger_s=0.5)  # sent by a flusher
version = store.create("job", {"epoch": 1})

def then(version, settle):
    print("carried on", settle is None, flush=True)

store.update_then("job", {("epoch",): 2}, expected=version, then=then)
print("returned", flush=True)
"""


def test_a_continued_write_queued_at_exit_is_sent_and_carried_on_first(
    emulators: Emulators, firestore_client: Any, firestore_collection: str
) -> None:
    """Its caller returned and the main thread ended: the write lingers on a daemon flusher."""
    assert emulators.firestore_host is not None
    done = subprocess.run(
        [sys.executable, "-c", _EXITS_WITH_A_WRITE_QUEUED, emulators.project, firestore_collection],
        env={**os.environ, "FIRESTORE_EMULATOR_HOST": emulators.firestore_host},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["returned", "carried on True"]
    snap = firestore_client.collection(firestore_collection).document("job").get()
    assert snap.to_dict()["epoch"] == 2
