"""Production's limits on what the library publishes and stores, in one place.

The local emulators are lenient where production is not: the Pub/Sub
emulator accepts 101 attributes, 257-byte keys, 1025-byte values, keys
starting with ``goog`` and empty keys, all of which Pub/Sub rejects, and the
Firestore emulator is no guide to document sizes. A message that only works
on the emulator would fail for the first time in production, so the library
checks every message it publishes against these limits itself, and sizes
the job document the way Firestore bills it.

Everything here is pure (no I/O). Byte lengths are UTF-8 with
``surrogatepass``: a ``str`` holding lone surrogates (which no valid key
has, but an attacker may send) is measured, never a crash.

=============================  ==============  ==============================
limit                          value           applies to
=============================  ==============  ==============================
``MAX_ATTRIBUTES``             100             attributes per message
``MAX_ATTRIBUTE_KEY_BYTES``    256             one attribute key, non-empty
``MAX_ATTRIBUTE_VALUE_BYTES``  1024            one attribute value
``RESERVED_KEY_PREFIX``        ``goog``        no key may start with it
``MAX_MESSAGE_BYTES``          10,000,000      data + attribute keys + values
``MAX_DOCUMENT_BYTES``         1,048,576       one Firestore document
``MAX_BATCH_WRITE_BYTES``      4,000,000       one BatchWrite the library sends
=============================  ==============  ==============================
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from pubsub_worker.errors import LimitExceeded

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_KEY_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_BATCH_WRITE_BYTES",
    "MAX_DOCUMENT_BYTES",
    "MAX_MESSAGE_BYTES",
    "RESERVED_KEY_PREFIX",
    "attribute_problem",
    "check_message",
    "document_bytes",
    "fit_attributes",
    "message_bytes",
    "problems",
]

MAX_ATTRIBUTES = 100
"""Attributes per Pub/Sub message."""

MAX_ATTRIBUTE_KEY_BYTES = 256
"""UTF-8 bytes of one attribute key (which must also be non-empty)."""

MAX_ATTRIBUTE_VALUE_BYTES = 1024
"""UTF-8 bytes of one attribute value."""

MAX_MESSAGE_BYTES = 10_000_000
"""Bytes of one message: its data plus the UTF-8 bytes of every attribute key and value."""

RESERVED_KEY_PREFIX = "goog"
"""Attribute keys starting with this are reserved by Pub/Sub."""

MAX_DOCUMENT_BYTES = 1_048_576
"""Storage size of one Firestore document (1 MiB)."""

MAX_BATCH_WRITE_BYTES = 4_000_000
"""Serialized bytes of one ``BatchWrite`` request the batching store sends.

Firestore refuses a request over 10 MiB (10,485,760 bytes), and with it every
write it carries. The cap is well under that, and under the 4 MiB (4,194,304
bytes) gRPC message limit of the Firestore emulator, which refuses a bigger
request as ``RESOURCE_EXHAUSTED``: batches are the same size on the emulator as
in production, so what runs in production is what the tests ran. A job
document is at most ``MAX_DOCUMENT_BYTES``, so three of the largest fit in one
request. A single write over the cap is still sent, alone.
"""

# A problem names the attribute it is about; keys are untrusted, so they are shown
# clipped and through repr() (control characters escaped), never as raw text.
_SHOWN_CHARS = 40
# check_message names this many problems and counts the rest: a message with thousands
# of bad attributes must not produce an error text of megabytes.
_NAMED_PROBLEMS = 5

# Firestore's storage sizes (https://cloud.google.com/firestore/docs/storage-size).
_DOCUMENT_OVERHEAD_BYTES = 32
_NUMBER_BYTES = 8  # integer, floating point, timestamp
_FLAG_BYTES = 1  # boolean, null
_GEO_POINT_BYTES = 16
_REFERENCE_OVERHEAD_BYTES = 16


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _shown(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return repr(text[:_SHOWN_CHARS]) + f"… ({_utf8_len(text)} bytes)"


def attribute_problem(key: str, value: str) -> str | None:
    """Why Pub/Sub would reject the attribute ``key=value``, or None when it is allowed.

    A key must be 1 to ``MAX_ATTRIBUTE_KEY_BYTES`` UTF-8 bytes and must not
    start with ``RESERVED_KEY_PREFIX``; a value may be empty and at most
    ``MAX_ATTRIBUTE_VALUE_BYTES`` bytes. The text names the key safely
    (clipped, control characters escaped).
    """
    if key == "":
        return "attribute key is empty"
    key_bytes = _utf8_len(key)
    if key_bytes > MAX_ATTRIBUTE_KEY_BYTES:
        return (
            f"attribute key {_shown(key)} is {key_bytes} bytes; "
            f"at most {MAX_ATTRIBUTE_KEY_BYTES} are allowed"
        )
    if key.startswith(RESERVED_KEY_PREFIX):
        return (
            f"attribute key {_shown(key)} starts with the reserved prefix {RESERVED_KEY_PREFIX!r}"
        )
    value_bytes = _utf8_len(value)
    if value_bytes > MAX_ATTRIBUTE_VALUE_BYTES:
        return (
            f"value of attribute {_shown(key)} is {value_bytes} bytes; "
            f"at most {MAX_ATTRIBUTE_VALUE_BYTES} are allowed"
        )
    return None


def message_bytes(data: bytes, attributes: Mapping[str, str]) -> int:
    """Size of a message as ``MAX_MESSAGE_BYTES`` counts it: data plus attribute keys and values."""
    return len(data) + sum(_utf8_len(k) + _utf8_len(v) for k, v in attributes.items())


def problems(data: bytes, attributes: Mapping[str, str]) -> list[str]:
    """Every production limit the message breaks, one human-readable text each; empty if none.

    Checked: the number of attributes, each attribute (:func:`attribute_problem`),
    the message size (:func:`message_bytes`), and that a message has data or
    at least one attribute (Pub/Sub rejects an empty message).
    """
    found: list[str] = []
    if len(attributes) > MAX_ATTRIBUTES:
        found.append(f"{len(attributes)} attributes; at most {MAX_ATTRIBUTES} are allowed")
    for key, value in attributes.items():
        problem = attribute_problem(key, value)
        if problem is not None:
            found.append(problem)
    size = message_bytes(data, attributes)
    if size > MAX_MESSAGE_BYTES:
        found.append(
            f"message is {size} bytes (data and attributes); "
            f"at most {MAX_MESSAGE_BYTES} are allowed"
        )
    if not data and not attributes:
        found.append("message has neither data nor attributes")
    return found


def check_message(data: bytes, attributes: Mapping[str, str]) -> None:
    """Raise :class:`~pubsub_worker.LimitExceeded` if Pub/Sub would reject the message.

    The error names what is wrong (the first few problems, and how many more
    there are).
    """
    found = problems(data, attributes)
    if not found:
        return
    text = "; ".join(found[:_NAMED_PROBLEMS])
    if len(found) > _NAMED_PROBLEMS:
        text += f"; and {len(found) - _NAMED_PROBLEMS} more"
    raise LimitExceeded(f"message breaks Pub/Sub's limits: {text}")


def fit_attributes(
    attributes: Mapping[str, str], *, reserved: int
) -> tuple[dict[str, str], dict[str, str]]:
    """Split attributes into those that can be published and those that cannot.

    Returns ``(kept, left_out)``. ``kept`` holds only attributes that are
    valid on their own (:func:`attribute_problem` is None), at most
    ``MAX_ATTRIBUTES - reserved`` of them, first come first kept, in input
    order; ``left_out`` holds every other attribute, in input order.
    ``reserved`` is how many attributes the caller adds itself (for example
    the failure path's own). The message size is not considered here: the
    caller adds its data and checks the whole message.

    Raises ``ValueError`` when ``reserved`` is not within 0..``MAX_ATTRIBUTES``.
    """
    if not 0 <= reserved <= MAX_ATTRIBUTES:
        raise ValueError(f"reserved must be within 0..{MAX_ATTRIBUTES}, not {reserved}")
    room = MAX_ATTRIBUTES - reserved
    kept: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for key, value in attributes.items():
        if len(kept) < room and attribute_problem(key, value) is None:
            kept[key] = value
        else:
            left_out[key] = value
    return kept, left_out


def _string_bytes(text: str) -> int:
    return _utf8_len(text) + 1


def _value_bytes(value: Any) -> int:
    # bool before int: bool is an int subclass, but Firestore stores it in 1 byte.
    if value is None or isinstance(value, bool):
        return _FLAG_BYTES
    if isinstance(value, (int, float, datetime.datetime)):
        return _NUMBER_BYTES
    if isinstance(value, str):
        return _string_bytes(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_string_bytes(str(name)) + _value_bytes(item) for name, item in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(item) for item in value)
    # Firestore's own value types, recognised by shape so this module imports no client.
    if hasattr(value, "latitude") and hasattr(value, "longitude"):
        return _GEO_POINT_BYTES
    path = getattr(value, "path", None)
    if isinstance(path, str):  # a DocumentReference: its name's size
        return _REFERENCE_OVERHEAD_BYTES + sum(_string_bytes(part) for part in path.split("/"))
    raise TypeError(f"cannot size a Firestore value of type {type(value).__name__}")


def document_bytes(fields: Mapping[str, Any]) -> int:
    """Storage size of a document with these fields, by Firestore's storage-size rules.

    A string is its UTF-8 bytes + 1; bytes their length; an integer, float or
    timestamp 8; a boolean or null 1; a map the sum over its entries of
    (name bytes + 1 + value size); an array the sum of its values; plus the
    32 bytes every document costs. The document's name is not counted (a
    budget leaves room for it: a collection id plus a 64-character id is
    about 100 bytes). Compare with ``MAX_DOCUMENT_BYTES``.

    Raises ``TypeError`` for a value Firestore cannot store (or a transform
    sentinel, whose stored size is not known here).
    """
    return _DOCUMENT_OVERHEAD_BYTES + _value_bytes(fields)
