"""The same assertions on every job store: memory (pure logic) and Firestore (the real emulator).

These pin the three primitives the claim and commit logic is built on:
create-if-absent, read with a version and the server's times, and
update-if-version-unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pubsub_worker.stores import FirestoreJobStore, MemoryJobStore
from pubsub_worker.stores.base import AlreadyExists, JobStore, VersionConflict
from pubsub_worker.stores.batching import BatchingFirestoreJobStore


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
