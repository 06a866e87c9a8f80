"""The message a push request carries, as the stock client's ``Message``.

A handler written for the pull worker reads ``message.data``,
``.attributes``, ``.message_id``, ``.publish_time``, ``.ordering_key``
and ``.delivery_attempt``; :class:`PushMessage` is a real
:class:`google.cloud.pubsub_v1.subscriber.message.Message` with those
fields, built from the request (:mod:`pubsub_worker.push.envelope`), so the
same handler runs unchanged behind a push endpoint.

A push delivery has no ack id: Pub/Sub takes the HTTP answer as the ack (a
2xx) or the nack (anything else). So ``ack()``, ``nack()``, ``drop()`` and
``modify_ack_deadline()`` send nothing anywhere; the answer comes from the
delivery's decided outcome once its write is durable
(:mod:`pubsub_worker.push.delivery`). Each request gets an ack id of its
own (``push:`` and 32 random hex digits), so that two requests carrying
the same message are two deliveries, the later superseding the earlier
in this process as a redelivery does in the pull worker.
"""

from __future__ import annotations

import concurrent.futures
import secrets
from collections.abc import Mapping
from typing import Any

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeStatus
from google.cloud.pubsub_v1.subscriber.message import Message
from google.pubsub_v1.types import PubsubMessage

__all__ = ["PushMessage", "Shape", "timestamp"]


class Shape:
    """The request shapes a push endpoint accepts (:attr:`PushMessage.shape`)."""

    WRAPPED = "wrapped"
    """Pub/Sub's default JSON envelope: ``{"message": {...}, "subscription": ...}``."""
    UNWRAPPED = "unwrapped"
    """``--push-no-wrapper --push-no-wrapper-write-metadata``: the data is the body, the
    metadata and attributes are headers."""
    CLOUDEVENT_BINARY = "cloudevent-binary"
    """Eventarc and Cloud Run functions: ``ce-*`` headers, the envelope as the body."""
    CLOUDEVENT_STRUCTURED = "cloudevent-structured"
    """A CloudEvent as ``application/cloudevents+json``, the envelope as its ``data``."""


def timestamp(text: str) -> Any:
    """The protobuf ``Timestamp`` of an RFC 3339 time (nanoseconds kept); ValueError if none."""
    stamp: Any = PubsubMessage.pb(PubsubMessage()).publish_time
    stamp.FromJsonString(text)
    return stamp


def _resolved() -> concurrent.futures.Future[AcknowledgeStatus]:
    future: concurrent.futures.Future[AcknowledgeStatus] = concurrent.futures.Future()
    future.set_result(AcknowledgeStatus.SUCCESS)
    return future


class PushMessage(Message):  # type: ignore[misc]  # the stock client ships no types
    """One push request's message, with the stock client's fields.

    ``publish_time`` is a timezone-aware ``datetime`` (UTC), built from the
    protobuf ``Timestamp`` given (:func:`timestamp`; none: the receipt's time);
    ``delivery_attempt`` is Pub/Sub's count when the subscription has a
    dead-letter policy, else ``None`` (attempts are counted in the job
    document all the same). :attr:`subscription` is the subscription the
    request names (``None`` when it names none), :attr:`shape` which of the
    :class:`Shape` forms it came in.

    ``ack()``, ``nack()``, ``drop()`` and ``modify_ack_deadline()`` send
    nothing: the HTTP answer settles a push delivery. Their ``*_with_response``
    forms return futures already resolved with ``SUCCESS``; what the answer
    was is decided by the job's outcome (a wrapped ``callback(message)`` sees
    the library's proxy, whose futures tell the truth).
    """

    def __init__(
        self,
        *,
        message_id: str,
        data: bytes = b"",
        attributes: Mapping[str, str] | None = None,
        publish_time: Any = None,
        ordering_key: str = "",
        delivery_attempt: int | None = None,
        subscription: str | None = None,
        shape: str = Shape.WRAPPED,
    ) -> None:
        pb: Any = PubsubMessage.pb(PubsubMessage())
        pb.message_id = message_id
        pb.data = data
        pb.attributes.update(attributes or {})
        if publish_time is not None:
            pb.publish_time.CopyFrom(publish_time)
        else:
            pb.publish_time.GetCurrentTime()
        pb.ordering_key = ordering_key
        super().__init__(pb, f"push:{secrets.token_hex(16)}", delivery_attempt or 0, None)
        self.subscription = subscription
        """The subscription the request names (``projects/P/subscriptions/S``), if any."""
        self.shape = shape
        """Which :class:`Shape` the request came in."""

    def ack(self) -> None:
        """Nothing to send: a 2xx answer is the ack."""

    def ack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """A future resolved with ``SUCCESS``: the 2xx answer is the ack."""
        return _resolved()

    def nack(self) -> None:
        """Nothing to send: a non-2xx answer is the nack."""

    def nack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """A future resolved with ``SUCCESS``: the non-2xx answer is the nack."""
        return _resolved()

    def drop(self) -> None:
        """Nothing to send: a push delivery is not leased."""

    def modify_ack_deadline(self, seconds: int) -> None:
        """Nothing to send: a push request's deadline is the subscription's, fixed."""

    def modify_ack_deadline_with_response(
        self, seconds: int
    ) -> concurrent.futures.Future[AcknowledgeStatus]:
        """A future resolved with ``SUCCESS``; nothing is sent."""
        return _resolved()
