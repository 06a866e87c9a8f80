"""The same assertions on every job store: memory (pure logic) and Firestore (the real emulator).

These pin the primitives the claim and commit logic is built on:
create-if-absent, read with a version and the server's times,
update-if-version-unchanged, and the transaction of a transactional step
(the job's changes and the body's writes, all or nothing, at the expected
version).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from google.cloud import firestore

from pubsub_worker.stores import FirestoreJobStore, MemoryJobStore
from pubsub_worker.stores.base import (
    WRITE_ID,
    AlreadyExists,
    JobStore,
    Version,
    VersionConflict,
)
from pubsub_worker.stores.batching import BatchingFirestoreJobStore
from pubsub_worker.stores.firestore_async import async_twin
from pubsub_worker.stores.transactions import AsyncTransactionalStore, TransactionalStore


@pytest.fixture(
    params=[
        "memory",
        pytest.param("firestore", marks=pytest.mark.emulator),
        pytest.param("batching", marks=pytest.mark.emulator),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore()
        return
    client = request.getfixturevalue("firestore_client")
    collection = request.getfixturevalue("firestore_collection")
    if request.param == "batching":
        batching = BatchingFirestoreJobStore(client, collection)
        yield batching
        batching.close()
        return
    yield FirestoreJobStore(client, collection)


def test_create_is_create_if_absent(store: JobStore) -> None:
    version = store.create("job-1", {"status": "running", "epoch": 1})
    snap = store.get("job-1")
    assert snap is not None
    assert snap.fields["status"] == "running"
    assert snap.version == version
    with pytest.raises(AlreadyExists):
        store.create("job-1", {"status": "running", "epoch": 99})
    again = store.get("job-1")
    assert again is not None
    assert again.fields["epoch"] == 1


def test_a_read_carries_server_times_that_order_the_writes(store: JobStore) -> None:
    v1 = store.create("job-t", {"epoch": 1})
    first = store.get("job-t")
    assert first is not None
    assert first.update_time is not None
    assert first.read_time is not None
    assert first.read_time >= first.update_time
    again = store.get("job-t")
    assert again is not None
    assert again.update_time == first.update_time  # no write in between: same time
    assert again.read_time is not None
    assert again.read_time >= first.read_time

    store.update("job-t", {("epoch",): 2}, expected=v1)
    second = store.get("job-t")
    assert second is not None
    assert second.update_time is not None
    assert second.read_time is not None
    assert second.update_time > first.update_time  # every write moves it: a lease renewal
    assert second.update_time >= first.read_time  # the write came after the first read
    assert second.read_time >= second.update_time


def test_what_a_caller_wrote_or_read_is_not_the_stored_document(store: JobStore) -> None:
    """Changing a dict after writing it, or one a read returned, changes nothing stored."""
    attributes = {"a": "1"}
    outbox = {"e1": {"topic": "t", "attributes": attributes}}
    tags = ["x"]
    v1 = store.create("job-c", {"epoch": 1, "outbox": outbox, "tags": tags})
    attributes["a"] = "changed"
    tags.append("y")
    step: dict[str, Any] = {"result": "1", "epoch": 1}
    v2 = store.update("job-c", {("steps", "s"): step}, expected=v1)
    step["result"] = "changed"
    read = store.get("job-c")
    assert read is not None
    read.fields["steps"]["s"]["epoch"] = 99
    read.fields["outbox"]["e1"]["attributes"].clear()
    assert store.update("job-c", {("epoch",): 2}, expected=v2) is not None
    again = store.get("job-c")
    assert again is not None
    assert again.fields["outbox"] == {"e1": {"topic": "t", "attributes": {"a": "1"}}}
    assert again.fields["tags"] == ["x"]
    assert again.fields["steps"] == {"s": {"result": "1", "epoch": 1}}
    assert again.fields["epoch"] == 2


def test_get_of_a_missing_document_is_none(store: JobStore) -> None:
    assert store.get("nothing-here") is None


def test_update_applies_only_at_the_expected_version(store: JobStore) -> None:
    v1 = store.create("job-2", {"epoch": 1, "steps": {}})
    v2 = store.update("job-2", {("epoch",): 2}, expected=v1)
    assert v2 != v1
    with pytest.raises(VersionConflict):
        store.update("job-2", {("epoch",): 3}, expected=v1)  # a stale owner's write
    snap = store.get("job-2")
    assert snap is not None
    assert snap.fields["epoch"] == 2
    assert snap.version == v2


def test_update_of_a_missing_document_conflicts(store: JobStore) -> None:
    version = store.create("job-3", {"epoch": 1})
    with pytest.raises(VersionConflict):
        store.update("job-404", {("epoch",): 2}, expected=version)


@pytest.mark.parametrize("name", ["a.b", "with space", "slash/inside", "`tick`", "ünï", "x" * 200])
def test_nested_paths_with_hostile_names_stay_one_field(store: JobStore, name: str) -> None:
    version = store.create("job-4", {"steps": {"other": {"result": "1"}}})
    store.update("job-4", {("steps", name): {"result": "2", "epoch": 1}}, expected=version)
    snap = store.get("job-4")
    assert snap is not None
    assert snap.fields["steps"][name] == {"result": "2", "epoch": 1}
    assert snap.fields["steps"]["other"] == {"result": "1"}  # siblings untouched


def test_bytes_and_nulls_round_trip(store: JobStore) -> None:
    data = bytes(range(256))
    store.create("job-5", {"data": data, "error": None})
    snap = store.get("job-5")
    assert snap is not None
    assert snap.fields["data"] == data
    assert snap.fields["error"] is None


def test_concurrent_conditional_updates_have_exactly_one_winner(store: JobStore) -> None:
    version = store.create("job-6", {"owner": "nobody"})

    def take(owner: str) -> bool:
        try:
            store.update("job-6", {("owner",): owner}, expected=version)
        except VersionConflict:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(take, [f"w{i}" for i in range(8)]))
    assert wins.count(True) == 1
    snap = store.get("job-6")
    assert snap is not None
    assert snap.fields["owner"] == f"w{wins.index(True)}"


def test_concurrent_creates_have_exactly_one_winner(store: JobStore) -> None:
    def make(owner: str) -> bool:
        try:
            store.create("job-7", {"owner": owner})
        except AlreadyExists:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(make, [f"w{i}" for i in range(8)]))
    assert wins.count(True) == 1


# -- transactions: the job's changes and the body's writes, all or nothing -------------


class Boom(Exception):
    """Raised by a transaction's body or changes: the caller's own error."""


def write_other(store: JobStore, transaction: Any, doc_id: str, fields: dict[str, Any]) -> None:
    """A business write in a transaction: what ``job.transactional_step``'s function does (in
    an async def handler's, Firestore's ``AsyncTransaction`` takes the async client's
    documents)."""
    if isinstance(store, MemoryJobStore):
        transaction.set(doc_id, fields)
    elif isinstance(transaction, firestore.AsyncTransaction):
        assert isinstance(store, FirestoreJobStore)
        twin = async_twin(store.client)
        transaction.set(twin.collection(store.collection).document(doc_id), fields)
    else:
        assert isinstance(store, FirestoreJobStore)
        transaction.set(store.ref(doc_id), fields)


Transact = Callable[..., tuple[Any, Version | None]]
"""``transact(doc_id, *, expected, body, changes)``, as the store's ``transact``."""


@pytest.fixture(params=["sync", "async"])
def transact(request: pytest.FixtureRequest, store: JobStore) -> Transact:
    """The store's transaction as a handler's step runs it: ``transact``, or, for an
    ``async def`` handler's, ``transact_async`` with the same body awaited (after a yield
    to the loop: the store's rounds must not count on a body that never suspends)."""
    if request.param == "sync":
        assert isinstance(store, TransactionalStore)
        return store.transact
    assert isinstance(store, AsyncTransactionalStore)

    def awaited(
        doc_id: str, *, expected: Version, body: Callable[[Any], Any], changes: Any
    ) -> tuple[Any, Version | None]:
        async def awaited_body(transaction: Any) -> Any:
            await asyncio.sleep(0)
            return body(transaction)

        return asyncio.run(
            store.transact_async(doc_id, expected=expected, body=awaited_body, changes=changes)
        )

    return awaited


def stored(store: JobStore, doc_id: str) -> dict[str, Any] | None:
    """A document's fields without the store's own bookkeeping (Firestore's ``write_id``)."""
    snap = store.get(doc_id)
    if snap is None:
        return None
    return {name: value for name, value in snap.fields.items() if name != WRITE_ID}


def step_changes(result: Any) -> dict[tuple[str, ...], Any]:
    return {("steps", "s"): {"result": json.dumps(result), "epoch": 1}}


def test_every_store_runs_transactions_and_async_ones(store: JobStore) -> None:
    """``job.transactional_step`` needs them (``await``-ed in an ``async def`` handler); a
    store without them refuses those steps."""
    assert isinstance(store, TransactionalStore)
    assert isinstance(store, AsyncTransactionalStore)


def test_a_transaction_commits_the_body_s_writes_and_the_job_s_changes_together(
    store: JobStore,
    transact: Transact,
) -> None:
    v1 = store.create("job-x1", {"epoch": 1, "status": "running"})
    runs: list[int] = []

    def body(transaction: Any) -> dict[str, int]:
        runs.append(1)
        write_other(store, transaction, "effect-x1", {"amount": 7})
        return {"n": 7}

    result, v2 = transact("job-x1", expected=v1, body=body, changes=step_changes)
    assert result == {"n": 7}
    assert runs == [1]
    assert v2 is not None
    assert v2 != v1
    snap = store.get("job-x1")
    assert snap is not None
    assert snap.version == v2  # the version returned is the job's new one
    assert snap.fields["steps"] == {"s": {"result": '{"n": 7}', "epoch": 1}}
    assert snap.fields["status"] == "running"  # fields not in the changes are kept
    assert stored(store, "effect-x1") == {"amount": 7}
    with pytest.raises(VersionConflict):
        store.update("job-x1", {("epoch",): 9}, expected=v1)  # the old version is stale
    store.update("job-x1", {("epoch",): 2}, expected=v2)  # the returned one is current


def test_a_transaction_at_a_stale_version_conflicts_and_writes_nothing(
    store: JobStore, transact: Transact
) -> None:
    v1 = store.create("job-x2", {"epoch": 1})
    v2 = store.update("job-x2", {("epoch",): 2}, expected=v1)  # a new owner's claim
    runs: list[int] = []

    def body(transaction: Any) -> str:
        runs.append(1)
        write_other(store, transaction, "effect-x2", {"by": "stale owner"})
        return "stale"

    with pytest.raises(VersionConflict):
        transact("job-x2", expected=v1, body=body, changes=step_changes)
    assert runs == []  # the version is checked before the body runs
    snap = store.get("job-x2")
    assert snap is not None
    assert snap.version == v2
    assert stored(store, "job-x2") == {"epoch": 2}
    assert store.get("effect-x2") is None


def test_a_transaction_on_a_missing_job_conflicts(store: JobStore, transact: Transact) -> None:
    version = store.create("job-x3", {"epoch": 1})

    def body(transaction: Any) -> str:
        write_other(store, transaction, "effect-x3", {"by": "nobody"})
        return "none"

    with pytest.raises(VersionConflict):
        transact("job-404", expected=version, body=body, changes=step_changes)
    assert store.get("job-404") is None
    assert store.get("effect-x3") is None


@pytest.mark.parametrize("raised_in", ["body", "changes"])
def test_a_transaction_whose_body_or_changes_raise_writes_nothing(
    store: JobStore, transact: Transact, raised_in: str
) -> None:
    """The caller's exception comes back as it is; neither the job nor the business write lands.

    ``changes`` raises when the step's record would not fit the document
    (``DocumentTooLarge``), after the body made its writes.
    """
    v1 = store.create("job-x4", {"epoch": 1})

    def body(transaction: Any) -> str:
        write_other(store, transaction, "effect-x4", {"amount": 1})
        if raised_in == "body":
            raise Boom("the step failed")
        return "done"

    def changes(result: Any) -> dict[tuple[str, ...], Any]:
        if raised_in == "changes":
            raise Boom("the record does not fit")
        return step_changes(result)

    with pytest.raises(Boom):
        transact("job-x4", expected=v1, body=body, changes=changes)
    snap = store.get("job-x4")
    assert snap is not None
    assert snap.version == v1
    assert stored(store, "job-x4") == {"epoch": 1}
    assert store.get("effect-x4") is None
    store.update("job-x4", {("epoch",): 2}, expected=v1)  # v1 is still the job's version


def test_a_transaction_and_an_update_racing_it_have_exactly_one_winner(
    store: JobStore, transact: Transact
) -> None:
    """A new owner's claim lands while the body runs: the transaction or the claim wins, never both.

    Firestore locks the job the transaction read, so the claim waits (and is
    retried by the store) until the commit, then finds the version moved; the
    memory store lets the claim in and the commit conflicts.
    """
    v1 = store.create("job-x5", {"owner": "first"})
    claimed: list[bool] = []
    racer: list[threading.Thread] = []

    def take() -> None:
        try:
            store.update("job-x5", {("owner",): "second"}, expected=v1)
        except VersionConflict:
            claimed.append(False)
        else:
            claimed.append(True)

    def body(transaction: Any) -> str:
        write_other(store, transaction, "effect-x5", {"by": "first"})
        if not racer:  # the body may run again on contention; one racer
            racer.append(threading.Thread(target=take))
            racer[0].start()
            racer[0].join(timeout=1.0)  # lets the racer land where nothing holds it back
        return "first"

    try:
        transact("job-x5", expected=v1, body=body, changes=lambda _r: {("step",): "done"})
    except VersionConflict:
        committed = False
    else:
        committed = True
    racer[0].join(timeout=60)
    assert not racer[0].is_alive()
    assert claimed == [not committed]
    if committed:
        assert stored(store, "job-x5") == {"owner": "first", "step": "done"}
        assert stored(store, "effect-x5") == {"by": "first"}
    else:
        assert stored(store, "job-x5") == {"owner": "second"}
        assert stored(store, "effect-x5") is None
