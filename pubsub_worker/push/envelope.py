"""Push request shapes, read into a :class:`~pubsub_worker.push.message.PushMessage`.

================================  =============================================================
shape                             how it is told apart, and where the message is
================================  =============================================================
CloudEvent, binary mode           a ``ce-specversion`` header; ``ce-type`` must be
                                  ``google.cloud.pubsub.topic.v1.messagePublished``; the body
                                  is the JSON envelope below (Eventarc, Cloud Run functions)
CloudEvent, structured mode       ``Content-Type: application/cloudevents+json``; the envelope
                                  is the event's ``data`` (or ``data_base64``)
unwrapped (``--push-no-wrapper``)  an ``x-goog-pubsub-message-id`` header (write metadata on):
                                  the body is the data, ``x-goog-pubsub-publish-time``,
                                  ``-subscription-name``, ``-ordering-key`` (the emulator:
                                  ``x-goog-ordering-key``) the metadata, every other header
                                  not of the transport an attribute
wrapped (Pub/Sub's default)       a JSON body ``{"message": {"data": base64, "attributes":
                                  {...}, "messageId", "publishTime", "orderingKey"},
                                  "subscription": ..., "deliveryAttempt": n}`` (the
                                  ``message_id``/``publish_time`` spellings too)
================================  =============================================================

Anything else is :class:`Malformed`, whose ``reason`` says what is wrong in
one line; the endpoint answers it 400 (never 2xx, never a crash): whatever
the headers and body, :func:`parse` returns a message or raises
:class:`Malformed`, nothing else. A ``deliveryAttempt`` is a whole number
from 0 to 2,147,483,647 (Pub/Sub's int32), as a JSON integer or a string of
ASCII digits; 0 or none means no count. Nothing here does I/O.

In the unwrapped form attributes travel as HTTP headers, whose names are
case-insensitive and shared with the transport. Names arrive lower-cased
(``orderId`` is delivered as ``orderid``), except the key attribute: given
``key_attribute``, the header that matches it case-insensitively is
delivered under its exact spelling, so the key is found as configured. An
attribute named like a transport header (``content-type``, ``authorization``,
``user-agent``, ``forwarded``, ``x-forwarded-*``, ``x-cloud-trace-context``,
``traceparent`` ...) cannot be told from it and is left out (a ``Content-Type``
attribute becomes the request's content type, but a sender puts its own
there when the message has none: the emulator's Java client sends
``application/x-www-form-urlencoded``). Keep the wrapped form when
attributes matter beyond a key attribute.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from .message import PushMessage, Shape, timestamp

__all__ = [
    "MAX_BODY_BYTES",
    "MESSAGE_PUBLISHED",
    "Malformed",
    "from_cloud_event_data",
    "from_envelope",
    "is_transport_header",
    "parse",
]

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body read: a 10 MB message (Pub/Sub's limit) base64-encoded, with
its envelope, fits; a larger body is refused (413) unread."""

MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
"""The CloudEvent type of a Pub/Sub message (Eventarc's Pub/Sub trigger)."""

_SUBSCRIPTION = re.compile(r"^projects/[^/\s]+/subscriptions/[^/\s]+$")
_MAX_ID_CHARS = 1024
_DIGITS = re.compile(r"[0-9]{1,10}")
_MAX_ATTEMPT = 2**31 - 1
"""Pub/Sub's delivery attempt is an int32."""

_TRANSPORT_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "authorization",
        "connection",
        "content-length",
        "content-type",
        "expect",
        "forwarded",
        "from",
        "host",
        "keep-alive",
        "te",
        "traceparent",
        "tracestate",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "via",
        "x-cloud-trace-context",
    }
)
_TRANSPORT_PREFIXES = ("x-forwarded-", "x-goog-", "x-envoy-", "x-serverless-", "ce-")


def is_transport_header(name: str) -> bool:
    """Whether a header named ``name`` is the transport's, so never an unwrapped attribute."""
    folded = name.lower()
    return folded in _TRANSPORT_HEADERS or folded.startswith(_TRANSPORT_PREFIXES)


class Malformed(ValueError):
    """The request is not a Pub/Sub push delivery; :attr:`reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse(
    headers: Mapping[str, str], body: bytes, *, key_attribute: str | None = None
) -> PushMessage:
    """The message of a push request; :class:`Malformed` if it is none.

    ``headers``: the request's headers, names in lowercase (as ASGI gives them).
    ``key_attribute``: the attribute that holds the job's key
    (``PUBSUB_WORKER_KEY_ATTRIBUTE``); in the unwrapped form, where attribute
    names arrive lower-cased, the header matching it case-insensitively is
    delivered under this exact spelling. The other shapes keep every name as sent.
    """
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if "ce-specversion" in headers:
        event_type = headers.get("ce-type", "")
        _check_event_type(event_type)
        return from_envelope(
            _json(body, "the CloudEvent's body"),
            shape=Shape.CLOUDEVENT_BINARY,
            fallback_id=headers.get("ce-id"),
        )
    if content_type == "application/cloudevents+json":
        return _structured(_json(body, "the CloudEvent"))
    if "x-goog-pubsub-message-id" in headers:
        return _unwrapped(headers, body, key_attribute)
    if not body.strip():
        raise Malformed(
            "an empty body without an x-goog-pubsub-message-id header: not a push request (an "
            "unwrapped subscription needs --push-no-wrapper-write-metadata)"
        )
    envelope = _json(
        body,
        "the body",
        " (and there is no x-goog-pubsub-message-id header: an unwrapped subscription needs "
        "--push-no-wrapper-write-metadata)",
    )
    return from_envelope(envelope, shape=Shape.WRAPPED)


def from_cloud_event_data(data: Any, *, event_id: str | None = None) -> PushMessage:
    """The message of an Eventarc Pub/Sub CloudEvent's ``data`` (a Cloud Run function's
    ``cloud_event.data``); ``event_id`` stands in for a missing message id."""
    return from_envelope(data, shape=Shape.CLOUDEVENT_BINARY, fallback_id=event_id)


def from_envelope(
    envelope: Any, *, shape: str = Shape.WRAPPED, fallback_id: str | None = None
) -> PushMessage:
    """The message of a JSON envelope ``{"message": {...}, "subscription": ...}``, parsed."""
    if not isinstance(envelope, dict):
        raise Malformed(f"the envelope is a JSON {_kind(envelope)}, not an object")
    raw = envelope.get("message")
    if not isinstance(raw, dict):
        found = "missing" if raw is None else f"a JSON {_kind(raw)}"
        raise Malformed(f'the envelope\'s "message" is {found}, not an object')
    message_id = _field(raw, "messageId", "message_id")
    if message_id is None and fallback_id:
        message_id = fallback_id
    message_id = _message_id(message_id, '"message.messageId"')
    data_text = raw.get("data", "")
    if data_text is None:
        data_text = ""
    if not isinstance(data_text, str):
        raise Malformed(f'"message.data" is a JSON {_kind(data_text)}, not base64 text')
    attributes = raw.get("attributes")
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise Malformed('"message.attributes" is not an object of strings')
    ordering_key = _field(raw, "orderingKey", "ordering_key")
    if ordering_key is None:
        ordering_key = ""
    if not isinstance(ordering_key, str):
        raise Malformed('"message.orderingKey" is not a string')
    publish = _field(raw, "publishTime", "publish_time")
    spelling = "delivery_attempt" if envelope.get("deliveryAttempt") is None else "deliveryAttempt"
    try:
        return PushMessage(
            message_id=message_id,
            data=_base64(data_text),
            attributes=attributes,
            publish_time=_timestamp(publish, '"message.publishTime"'),
            ordering_key=ordering_key,
            delivery_attempt=_attempt(envelope.get(spelling), f'"{spelling}"'),
            subscription=_subscription(envelope.get("subscription"), '"subscription"'),
            shape=shape,
        )
    except UnicodeError:  # a lone surrogate (a JSON escape): Pub/Sub sends valid UTF-8 only
        raise Malformed("the message holds text that is not valid UTF-8") from None


# -- the shapes -----------------------------------------------------------------------


def _structured(event: Any) -> PushMessage:
    if not isinstance(event, dict):
        raise Malformed(f"the CloudEvent is a JSON {_kind(event)}, not an object")
    if not event.get("specversion"):
        raise Malformed('the CloudEvent has no "specversion"')
    _check_event_type(event.get("type"))
    fallback = event.get("id") if isinstance(event.get("id"), str) else None
    if "data" in event:
        data = event["data"]
        if isinstance(data, str):  # data given as JSON text
            data = _json(data.encode("utf-8", "surrogatepass"), 'the CloudEvent\'s "data"')
    elif "data_base64" in event:
        encoded = event["data_base64"]
        if not isinstance(encoded, str):
            raise Malformed('the CloudEvent\'s "data_base64" is not text')
        data = _json(_base64(encoded, '"data_base64"'), 'the CloudEvent\'s "data_base64"')
    else:
        raise Malformed("the CloudEvent has no data")
    return from_envelope(data, shape=Shape.CLOUDEVENT_STRUCTURED, fallback_id=fallback)


def _unwrapped(headers: Mapping[str, str], body: bytes, key_attribute: str | None) -> PushMessage:
    message_id = _message_id(headers.get("x-goog-pubsub-message-id"), "x-goog-pubsub-message-id")
    attributes = {name: value for name, value in headers.items() if not is_transport_header(name)}
    if key_attribute is not None:
        folded = key_attribute.lower()
        found = next((name for name in attributes if name.lower() == folded), None)
        if found is not None and found != key_attribute:
            attributes[key_attribute] = attributes.pop(found)
    attempt = headers.get("x-goog-pubsub-delivery-attempt")
    return PushMessage(
        message_id=message_id,
        data=body,
        attributes=attributes,
        publish_time=_timestamp(
            headers.get("x-goog-pubsub-publish-time"), "x-goog-pubsub-publish-time"
        ),
        ordering_key=headers.get(
            "x-goog-pubsub-ordering-key", headers.get("x-goog-ordering-key", "")
        ),
        delivery_attempt=_attempt(attempt, "x-goog-pubsub-delivery-attempt"),
        subscription=_subscription(
            headers.get("x-goog-pubsub-subscription-name"), "x-goog-pubsub-subscription-name"
        ),
        shape=Shape.UNWRAPPED,
    )


# -- fields -----------------------------------------------------------------------------


def _check_event_type(event_type: Any) -> None:
    if event_type != MESSAGE_PUBLISHED:
        raise Malformed(
            f"a CloudEvent of type {str(event_type)[:200]!r}, not a Pub/Sub message "
            f"({MESSAGE_PUBLISHED})"
        )


def _json(body: bytes, what: str, hint: str = "") -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"{what} is not JSON{hint}: {str(exc)[:200]}") from None


def _field(raw: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if raw.get(name) is not None:
            return raw[name]
    return None


def _message_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise Malformed(f"{what} is missing or empty: a push delivery names its message")
    if len(value) > _MAX_ID_CHARS or any(ord(c) < 32 for c in value):
        raise Malformed(f"{what} is not a message id")
    return value


def _base64(text: str, what: str = '"message.data"') -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Malformed(f"{what} is not base64") from None


def _timestamp(value: Any, what: str) -> Any:
    if value is None or value == "":
        return None  # the receipt's time stands in (Pub/Sub always sends it)
    if not isinstance(value, str):
        raise Malformed(f"{what} is not an RFC 3339 time")
    try:
        stamp = timestamp(value.strip())
        # As the stock Message reads it: a float of seconds to a datetime. The last
        # nanoseconds of 9999 round up into the year 10000, which a datetime cannot hold.
        datetime.datetime.fromtimestamp(stamp.seconds + stamp.nanos / 1e9, tz=datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise Malformed(f"{what} is not an RFC 3339 time: {value[:64]!r}") from None
    return stamp


def _attempt(value: Any, what: str) -> int | None:
    """Pub/Sub's count (int32) as a JSON integer or ASCII digits; 0 or none: no count."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip(" \t")):
        attempt = int(value.strip(" \t"))
    elif type(value) is int:  # not a bool, not a float (1e400 is inf, 3.0 is no count)
        attempt = value
    else:
        attempt = -1
    if not 0 <= attempt <= _MAX_ATTEMPT:
        raise Malformed(
            f"{what} is not a delivery count (a whole number from 0 to {_MAX_ATTEMPT}): "
            f"{_shown(value)}"
        )
    return attempt or None


def _shown(value: Any) -> str:
    """A short, one-line form of a JSON value for a reason."""
    if isinstance(value, str):
        return repr(value[:32])
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "an integer of more than 64 bits"
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)  # 1e400 shows as Infinity, as JavaScript would
    return f"a JSON {_kind(value)}"


def _subscription(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _SUBSCRIPTION.match(value):
        raise Malformed(f"{what} is not projects/PROJECT/subscriptions/ID")
    return value


def _kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
