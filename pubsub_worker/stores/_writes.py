"""Job writes as raw Firestore ``Write`` protobufs, built without proto-plus.

The client library builds a write through proto-plus wrappers; filling the
raw protobuf directly costs a fraction of its CPU. The values a job
document holds (None, bool, int, float, str, bytes, datetime, dict, list,
tuple) are encoded here exactly as
``google.cloud.firestore_v1._helpers.encode_value`` does. A write holding
anything else (a sentinel such as ``SERVER_TIMESTAMP``, a ``GeoPoint``, a
document reference, a set, BSON types) is built by the library's own
helpers instead, so every value the library accepts is accepted here, with
the same errors for those it rejects.
"""

from __future__ import annotations

import datetime
import functools
import itertools
from collections.abc import Mapping
from typing import Any

import proto.datetime_helpers  # type: ignore[import-untyped]
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from google.cloud.firestore_v1 import _helpers
from google.cloud.firestore_v1.field_path import FieldPath
from google.cloud.firestore_v1.types import write as write_types

from .base import Changes

__all__ = ["create_write", "framed_bytes", "set_timestamp", "update_write"]

_WRITE = write_types.Write.pb()
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_NANOS_KEPT = DatetimeWithNanoseconds
_NANOS_EXACT = (DatetimeWithNanoseconds, proto.datetime_helpers.DatetimeWithNanoseconds)


class _Unsupported(Exception):
    """A value the fast path does not encode: the library's helpers build the write."""


def set_timestamp(target: Any, value: datetime.datetime, *, exact: bool = False) -> None:
    """Set the protobuf ``Timestamp`` ``target`` to ``value`` (naive is UTC).

    Nanoseconds are kept where the library keeps them: for a field value of
    ``google.api_core``'s ``DatetimeWithNanoseconds``, and (``exact``) for an
    update time, which the library reads back as proto-plus's own class.
    """
    aware = value if value.tzinfo is not None else value.replace(tzinfo=datetime.timezone.utc)
    delta = aware - _EPOCH
    target.seconds = delta.days * 86400 + delta.seconds
    if type(value) is datetime.datetime:  # the library's own times: no nanoseconds to keep
        target.nanos = value.microsecond * 1000
    elif isinstance(value, _NANOS_KEPT) or (exact and isinstance(value, _NANOS_EXACT)):
        target.nanos = int(value.nanosecond)
    else:
        target.nanos = value.microsecond * 1000


_SCALARS: dict[type, str] = {
    bool: "boolean_value",
    int: "integer_value",
    str: "string_value",
    float: "double_value",
    bytes: "bytes_value",
}


def _fill(target: Any, value: Any) -> None:
    """Set the protobuf ``Value`` ``target`` to ``value``."""
    # Exact types: subclasses (enums, BSON bytes) go the slow way.
    scalar = _SCALARS.get(type(value))
    if scalar is not None:
        setattr(target, scalar, value)
    else:
        _fill_other(target, value)


def _fill_other(target: Any, value: Any) -> None:
    """Set the protobuf ``Value`` ``target`` to ``value``, not one of :data:`_SCALARS`' types.

    A write's own fields are looked up in :data:`_SCALARS` where they are set (most are
    scalars: no call for them); their other values, and every value nested in a map or an
    array, come here.
    """
    if value is None:
        target.null_value = 0
    elif isinstance(value, datetime.datetime):
        set_timestamp(target.timestamp_value, value)
    elif (kind := type(value)) is dict:
        target.map_value.SetInParent()
        fields = target.map_value.fields
        for name, item in value.items():
            if type(name) is not str:
                raise _Unsupported
            if not name:  # the library's FieldPath check, for keys of nested maps
                raise ValueError("One or more components is not a string or is empty.")
            _fill(fields[name], item)
    elif kind is list or kind is tuple:
        target.array_value.SetInParent()
        values = target.array_value.values
        for item in value:
            _fill(values.add(), item)
    else:
        raise _Unsupported


def create_write(name: str, fields: Mapping[str, Any]) -> Any:
    """A create-if-absent of document ``name`` (a full resource name) with ``fields``."""
    try:
        write = _WRITE()
        document = write.update
        document.name = name
        values = document.fields
        for key, value in fields.items():
            if type(key) is not str:
                raise _Unsupported
            if not key:
                raise ValueError("One or more components is not a string or is empty.")
            scalar = _SCALARS.get(type(value))  # most of a claim's fields: no call for them
            if scalar is not None:
                setattr(values[key], scalar, value)
            else:
                _fill_other(values[key], value)
        write.current_document.exists = False
    except _Unsupported:
        return _single(_helpers.pbs_for_create(name, dict(fields)))
    return write


def update_write(name: str, changes: Changes, expected: datetime.datetime) -> Any:
    """An update of the field paths in ``changes``, iff the update time is ``expected``.

    Raises ``ValueError`` for an empty update, an invalid field path, or two
    paths of which one contains the other, like the library.
    """
    if not changes:
        raise ValueError("Cannot update with an empty document.")
    paths = sorted(changes)
    for shorter, longer in itertools.pairwise(paths):
        if longer[: len(shorter)] == shorter:
            raise ValueError(f"Conflicting field path: {longer}, {shorter}")
    masks = [_mask(path) for path in paths]  # validates every part
    try:
        write = _WRITE()
        document = write.update
        document.name = name
        for path in paths:
            target = document.fields
            for part in path[:-1]:
                parent = target[part]
                parent.map_value.SetInParent()
                target = parent.map_value.fields
            value = changes[path]
            scalar = _SCALARS.get(type(value))
            if scalar is not None:
                setattr(target[path[-1]], scalar, value)
            else:
                _fill_other(target[path[-1]], value)
        write.update_mask.field_paths.extend(masks)
    except _Unsupported:
        data = dict(zip(masks, (changes[path] for path in paths), strict=True))
        option = _helpers.LastUpdateOption(expected)
        write = _single(_helpers.pbs_for_update(name, data, option))
        return write
    set_timestamp(write.current_document.update_time, expected, exact=True)
    return write


@functools.lru_cache(maxsize=1024)
def _mask(path: tuple[str, ...]) -> str:
    """The field path ``path`` as an update mask names it; a job's paths repeat, so kept.

    Raises ``ValueError`` for an invalid part, like the library (not kept).
    """
    return str(FieldPath(*path).to_api_repr())


def framed_bytes(payload_bytes: int) -> int:
    """Bytes a length-delimited field of ``payload_bytes`` adds to a protobuf message.

    Its tag (one byte: field numbers below 16, such as a ``BatchWriteRequest``'s
    ``database`` and ``writes``), the length as a varint, and the payload: a
    write ``w`` adds ``framed_bytes(w.ByteSize())`` to the request.
    """
    return 1 + max(1, (payload_bytes.bit_length() + 6) // 7) + payload_bytes


def _single(writes: list[Any]) -> Any:
    (write,) = writes
    return write._pb
