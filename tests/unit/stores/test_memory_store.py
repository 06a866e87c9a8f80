"""The in-memory store: transactions check the version, updates copy only what changes."""

from __future__ import annotations

from typing import Any

import pytest

from pubsub_worker._support import fences
from pubsub_worker.stores.base import VersionConflict
from pubsub_worker.stores.memory import MemoryJobStore


def _stale_transaction(store: MemoryJobStore) -> tuple[Any, object]:
    """A transaction by an owner that read version 1 after another writer made version 2."""
    first = store.create("job", {"epoch": 1})
    store.update("job", {("epoch",): 2}, expected=first)
    return store.transact(
        "job",
        expected=first,
        body=lambda transaction: "written",
        changes=lambda result: {("by",): "the stale owner"},
    )


def test_a_transaction_on_a_stale_version_writes_nothing() -> None:
    store = MemoryJobStore()
    with pytest.raises(VersionConflict):
        _stale_transaction(store)
    snap = store.get("job")
    assert snap is not None
    assert snap.fields == {"epoch": 2}


def test_with_the_transaction_fence_switched_off_the_stale_write_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")  # the switch's own guard
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:1")
    store = MemoryJobStore()
    with fences.disabled("transaction"):
        result, _ = _stale_transaction(store)
    snap = store.get("job")
    assert snap is not None
    assert (result, snap.fields) == ("written", {"epoch": 2, "by": "the stale owner"})
    # The block ended: the fence is back, and the next stale transaction writes nothing.
    stale = snap.version
    store.update("job", {("epoch",): 3}, expected=stale)
    with pytest.raises(VersionConflict):
        store.transact(
            "job",
            expected=stale,
            body=lambda transaction: "written",
            changes=lambda result: {("by",): "another stale owner"},
        )
    after = store.get("job")
    assert after is not None
    assert after.fields == {"epoch": 3, "by": "the stale owner"}


def test_an_update_changes_only_its_paths_and_shares_nothing_a_reader_can_change() -> None:
    store = MemoryJobStore()
    version = store.create("job", {"steps": {"a": {"result": 1}}, "epoch": 1})
    before = store.get("job")
    version = store.update("job", {("steps", "b", "result"): [2]}, expected=version)
    store.update("job", {("steps", "a", "result"): 3, ("epoch",): 2}, expected=version)
    after = store.get("job")
    assert before is not None
    assert after is not None
    assert before.fields == {"steps": {"a": {"result": 1}}, "epoch": 1}
    assert after.fields == {"steps": {"a": {"result": 3}, "b": {"result": [2]}}, "epoch": 2}
    after.fields["steps"]["b"]["result"].append("changed by a reader")
    again = store.get("job")
    assert again is not None
    assert again.fields["steps"]["b"]["result"] == [2]
