"""``python -m benchmarks.inprocess --floor``: a delivery's work alone (the floor) and through
the library's parts in one object (the lean prototype), beside the library."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.floor import FloorDelivery
from benchmarks.inprocess import (
    SUBSCRIPTION,
    _Message,
    _started_wrapper,
    floor_once,
    lean_once,
    main,
)
from benchmarks.lean import LeanDelivery, runtime_of
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores.base import Changes, Version

_SAME_VALUES = (
    "key",
    "subscription",
    "shard",
    "status",
    "epoch",
    "message_id",
    "delivery",
    "lease_seconds",
    "attempts",
    "payload_sha256",
)
"""The claim's fields that do not depend on who writes it or when."""


class _Recording(MemoryJobStore):
    """A memory store that keeps every create's fields and every update's changes."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.updated: list[tuple[str, dict[tuple[str, ...], Any]]] = []

    def create(self, doc_id: str, fields: Any) -> Version:
        self.created.append((doc_id, dict(fields)))
        return super().create(doc_id, fields)

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        self.updated.append((doc_id, dict(changes)))
        return super().update(doc_id, changes, expected=expected)


def _library_writes() -> _Recording:
    """What the library writes for one one-step delivery (message 7)."""
    library = _Recording()
    wrapped = _started_wrapper(library)
    try:
        wrapped(_Message(7))
    finally:
        wrapped.close()
    return library


def test_the_floor_writes_what_the_library_writes() -> None:
    # The floor is only a floor while it does the library's work: if the library's claim or
    # completion changes shape, this fails until the floor follows.
    library, floor = _library_writes(), _Recording()
    FloorDelivery(floor, subscription=SUBSCRIPTION, key_attribute="op")(_Message(7))

    assert len(library.created) == len(floor.created) == 1
    assert len(library.updated) == len(floor.updated) == 1
    (lib_doc, lib_claim), (floor_doc, floor_claim) = library.created[0], floor.created[0]
    # Written only while a tracer provider records spans (a test before may have set one):
    # tracing is structure, which the floor leaves out.
    lib_claim.pop("trace_parent", None)
    assert floor_doc == lib_doc
    assert floor_claim.keys() == lib_claim.keys()
    assert {n: floor_claim[n] for n in _SAME_VALUES} == {n: lib_claim[n] for n in _SAME_VALUES}
    (lib_doc, lib_done), (floor_doc, floor_done) = library.updated[0], floor.updated[0]
    assert floor_doc == lib_doc
    assert floor_done.keys() == lib_done.keys()
    assert floor_done[("status",)] == lib_done[("status",)] == "completed"
    assert floor_done[("steps", "one")]["result"] == lib_done[("steps", "one")]["result"]


def test_the_lean_prototype_writes_what_the_library_writes() -> None:
    # Built from the library's own parts, it writes the same fields with the same values
    # (but the times, and the owner: another worker's).
    library, lean = _library_writes(), _Recording()
    wrapped = _started_wrapper(lean)
    try:
        LeanDelivery(runtime_of(wrapped))(_Message(7))
    finally:
        wrapped.close()

    assert len(library.created) == len(lean.created) == 1
    assert len(library.updated) == len(lean.updated) == 1
    (lib_doc, lib_claim), (lean_doc, lean_claim) = library.created[0], lean.created[0]
    lib_claim.pop("trace_parent", None)  # only while a tracer provider records
    lean_claim.pop("trace_parent", None)
    assert lean_doc == lib_doc
    assert lean_claim.keys() == lib_claim.keys()
    assert {n: lean_claim[n] for n in _SAME_VALUES} == {n: lib_claim[n] for n in _SAME_VALUES}
    (lib_doc, lib_done), (lean_doc, lean_done) = library.updated[0], lean.updated[0]
    assert lean_doc == lib_doc
    assert lean_done.keys() == lib_done.keys()
    timeless = {path: value for path, value in lib_done.items() if not _is_time(value)}
    assert {path: lean_done[path] for path in timeless} == timeless
    lib_step, lean_step = lib_done[("steps", "one")], lean_done[("steps", "one")]
    assert {**lean_step, "at": None} == {**lib_step, "at": None}


def _is_time(value: Any) -> bool:
    return hasattr(value, "tzinfo") or (isinstance(value, dict) and "at" in value)


def test_the_lean_prototype_acks_every_message_and_leaves_nothing_held() -> None:
    wrapped = _started_wrapper(MemoryJobStore())
    try:
        rt = runtime_of(wrapped)
        deliver = LeanDelivery(rt)
        messages = [_Message(n) for n in range(5)]
        for message in messages:
            deliver(message)
        assert all(message.acked for message in messages)
        assert deliver.completed == 5
        assert (rt.keeper.watched(), len(rt.tracker)) == (0, 0)
        assert rt.metrics.snapshot()["completed"] == 5
    finally:
        wrapped.close()
    assert lean_once(20) > 0


def test_the_floor_acks_every_message_and_holds_no_key_after() -> None:
    store = MemoryJobStore()
    deliver = FloorDelivery(store, subscription=SUBSCRIPTION, key_attribute="op")
    messages = [_Message(n) for n in range(5)]
    for message in messages:
        deliver(message)
    assert all(message.acked for message in messages)
    assert (deliver.received, deliver.completed) == (5, 5)
    assert floor_once(20) > 0


def test_a_message_without_its_key_is_refused() -> None:
    message = _Message(1)
    message.attributes = {}
    deliver = FloorDelivery(MemoryJobStore(), subscription=SUBSCRIPTION, key_attribute="op")
    with pytest.raises(ValueError, match="key attribute"):
        deliver(message)
    assert not message.acked


def test_the_report_gives_both_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--floor", "--messages", "200", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU per message, medians of 1 runs of 200 messages: the library ")
    assert ", the lean prototype " in out
    assert ", the floor " in out
    assert "ms of structure, of which " in out


def test_beside_callback_threads_the_floor_is_a_third_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--floor", "--threads", "2", "--messages", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "\nthe lean prototype (the library's parts, one object per delivery" in out
    assert "\nthe floor (the same writes, digests, key gate and ack in one function" in out
    assert "BatchWrite" not in out  # the in-memory store sends no RPC


def test_the_floor_is_not_timed_cold_nor_profiled(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--floor", "--evict", "1"])
    assert "--floor times the messages as they run" in capsys.readouterr().err
