"""The raw-protobuf job writes equal what the Firestore library builds for the same data."""

from __future__ import annotations

import datetime
from typing import Any

import proto.datetime_helpers  # type: ignore[import-untyped]
import pytest
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from google.cloud import firestore
from google.cloud.firestore_v1 import _helpers
from google.cloud.firestore_v1.field_path import FieldPath

from pubsub_worker.stores._writes import create_write, update_write

NAME = "projects/p/databases/(default)/documents/jobs/abc123"
UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 5, 17, 12, 30, 45, 123456, tzinfo=UTC)
NANOS = DatetimeWithNanoseconds(  # type: ignore[no-untyped-call]
    2026, 5, 17, 12, 30, 45, nanosecond=123456789, tzinfo=UTC
)
# Update times as the library reads them back (proto-plus's own class).
VERSION = proto.datetime_helpers.DatetimeWithNanoseconds(
    2026, 5, 17, 12, 30, 45, nanosecond=123456789, tzinfo=UTC
)

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**63 - 1,
    1.5,
    float("inf"),
    "",
    "ünï😀text",
    b"",
    bytes(range(256)),
    NOW,
    NANOS,
    datetime.datetime(2026, 1, 2, 3, 4, 5, 6),  # naive: UTC
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
    {},
    [],
    (),
    {"a": 1, "b.c": {"d": [1, "x", None, {"e": b"f"}]}, "`": "tick"},
    [1, [2, [3]], {"k": NOW}],
]


def _library_create(fields: dict[str, Any]) -> Any:
    (write,) = _helpers.pbs_for_create(NAME, fields)
    return write._pb


def _library_update(changes: dict[tuple[str, ...], Any], expected: Any) -> Any:
    data = {FieldPath(*path).to_api_repr(): value for path, value in changes.items()}
    option = _helpers.LastUpdateOption(expected)
    (write,) = _helpers.pbs_for_update(NAME, data, option)
    return write._pb


def _sorted_mask(write: Any) -> Any:
    copy = type(write)()
    copy.CopyFrom(write)
    paths = sorted(copy.update_mask.field_paths)
    del copy.update_mask.field_paths[:]
    copy.update_mask.field_paths.extend(paths)
    return copy


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_create_encodes_each_value_like_the_library(value: Any) -> None:
    fields = {"value": value, "status": "running", "epoch": 1}
    assert create_write(NAME, fields) == _library_create(fields)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_update_encodes_each_value_like_the_library(value: Any) -> None:
    changes = {("steps", "a.b`c"): {"result": value, "epoch": 2}, ("value",): value}
    ours = update_write(NAME, changes, VERSION)
    assert _sorted_mask(ours) == _sorted_mask(_library_update(changes, VERSION))
    assert ours.current_document.update_time.nanos == 123456789


def test_update_of_sibling_paths_merges_them_into_one_map() -> None:
    changes = {
        ("steps", "one"): {"result": "1"},
        ("steps", "two"): {"result": "2"},
        ("outbox", "x", "sent"): True,
        ("status",): "completed",
    }
    ours = update_write(NAME, changes, NOW)
    assert _sorted_mask(ours) == _sorted_mask(_library_update(changes, NOW))
    assert sorted(ours.update_mask.field_paths) == [
        "outbox.x.sent",
        "status",
        "steps.one",
        "steps.two",
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {("steps",): {}, ("steps", "a"): 1},
        {("outbox", "x"): {"sent": False}, ("outbox", "x", "sent"): True},
    ],
)
def test_conflicting_paths_are_rejected(changes: dict[tuple[str, ...], Any]) -> None:
    with pytest.raises(ValueError, match="Conflicting field path"):
        update_write(NAME, changes, NOW)


def test_empty_update_and_empty_names_are_rejected_like_the_library() -> None:
    with pytest.raises(ValueError, match="empty"):
        update_write(NAME, {}, NOW)
    bad_changes: tuple[dict[tuple[str, ...], Any], ...] = (
        {("steps", ""): 1},
        {("steps",): {"": 1}},
    )
    for bad in bad_changes:
        with pytest.raises(ValueError, match="empty"):
            update_write(NAME, bad, NOW)
        with pytest.raises(ValueError, match="empty"):
            _library_update(bad, NOW)
    for fields in ({"": 1}, {"a": {"b": {"": 1}}}):
        with pytest.raises(ValueError, match="empty"):
            create_write(NAME, fields)
        with pytest.raises(ValueError, match="empty"):
            _library_create(fields)


def test_values_the_fast_path_does_not_know_go_through_the_library() -> None:
    class Level(int):
        pass

    fields = {"geo": firestore.GeoPoint(1.5, 2.5), "set": {1}, "level": Level(3)}
    assert create_write(NAME, fields) == _library_create(fields)
    changes: dict[tuple[str, ...], Any] = {
        ("at",): firestore.SERVER_TIMESTAMP,
        ("level",): Level(4),
    }
    assert _sorted_mask(update_write(NAME, changes, NOW)) == _sorted_mask(
        _library_update(changes, NOW)
    )
    with pytest.raises(TypeError):
        create_write(NAME, {"bad": object()})
