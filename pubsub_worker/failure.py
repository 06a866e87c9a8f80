"""The reviewed failure path: a failure topic plus a ``failed`` record.

A job that keeps failing (``MAX_ATTEMPTS`` claims), raises
:class:`~pubsub_worker.errors.PermanentError`, or a message that cannot
become a job (missing key attribute, a key reused for another payload) is
sent here instead of being retried forever. The order is fixed so that
nothing is lost on a crash:

1. publish the original data and attributes, plus the reason, to
   ``FAILURE_TOPIC`` (when configured) and wait for the publish;
2. write the ``failed`` record (fenced by the epoch for a claimed job), with
   the original data when it fits, so ``pubsub-worker replay`` can revive it;
3. only then ack the message.

A crash between 1 and 2 publishes the failure again on the redelivery (the
failure message carries the key, so a reviewer sees the duplicate); a crash
between 2 and 3 acks on the redelivery without publishing again. If step 1
or 2 fails, the message is not acked: it comes back after a backoff.

**Production's limits.** The failure message carries the library's
``pubsub_worker_*`` attributes plus as many of the original attributes as
Pub/Sub allows (at most 100 in all, each valid); the originals left out are
counted in ``pubsub_worker_attributes_left_out`` and every original
attribute is kept in the failed record (``attributes``, JSON). The record
keeps the original data when it fits the job document's budget (at most
512 KiB); otherwise the failure topic is its only copy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from . import store as s
from .claim import now_utc
from .context import Publish
from .errors import FailurePathUnavailable
from .job import Job
from .keys import display, document_id
from .limits import MAX_ATTRIBUTE_VALUE_BYTES, fit_attributes, problems
from .logs import job_logger
from .metrics import Counter, Metrics
from .outbox import LIBRARY_ATTRIBUTE_PREFIX
from .records import STEPS_BUDGET_BYTES, encodable_text
from .store import AlreadyExists, JobStore, Status

__all__ = ["LEFT_OUT_ATTRIBUTE", "MAX_STORED_DATA_BYTES", "FailurePath", "rejected_document_id"]

_LOGGER = logging.getLogger(__name__)

MAX_STORED_DATA_BYTES = 512 * 1024
LEFT_OUT_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "attributes_left_out"
_MAX_STORED_ATTRIBUTES_BYTES = 128 * 1024
_REVIEW_ATTRIBUTES = 7  # reason, error, key, message_id, subscription, attempts, left_out


class FailurePath:
    """Sends a message to review. Safe to call again for the same message."""

    def __init__(
        self,
        *,
        store: JobStore,
        subscription: str,
        publish: Publish,
        failure_topic: str | None,
        metrics: Metrics,
        retention_s: float,
        io_timeout_s: float,
    ) -> None:
        self._store = store
        self._subscription = subscription
        self._publish = publish
        self._topic = failure_topic
        self._metrics = metrics
        self._retention_s = retention_s
        self._io_timeout_s = io_timeout_s

    def send(
        self,
        *,
        message_id: str,
        data: bytes,
        attributes: Mapping[str, str],
        key: str | None,
        reason: str,
        error: str,
        job: Job | None,
    ) -> None:
        """Publish for review, record ``failed``; the caller acks after this returns.

        With ``job`` the record is the job's own document, written only if this
        owner still holds it (else :class:`~pubsub_worker.errors.LostOwnership`).
        Without, a separate record keyed by the message id is created.
        Raises :class:`~pubsub_worker.errors.FailurePathUnavailable` when the
        message can be neither published for review nor kept in its record;
        any error of the publish or the write propagates (nothing is acked).
        """
        room = job.document_room if job is not None else STEPS_BUDGET_BYTES
        stored = len(data) <= min(MAX_STORED_DATA_BYTES, room)
        published = False
        if self._topic is not None:
            review = self.review_message(
                message_id, data, attributes, key, reason, error, job.attempt if job else 0
            )
            if review is not None:
                self._publish(self._topic, data, review).result(timeout=self._io_timeout_s)
                published = True
        if not published and not stored:
            raise FailurePathUnavailable(
                f"message {message_id} ({len(data)} bytes) cannot be kept in its failed record "
                f"(room {min(MAX_STORED_DATA_BYTES, room)} bytes) and "
                + (
                    "does not fit a failure message"
                    if self._topic
                    else "PUBSUB_WORKER_FAILURE_TOPIC is not set"
                )
                + "; it is left unacked (configure a failure topic or a dead-letter policy)"
            )
        kept, left_out = _stored_attributes(attributes)
        extra: dict[str, Any] = {
            s.ATTRIBUTES: json.dumps(kept, ensure_ascii=False),
            s.DATA: data if stored else None,
            s.MESSAGE_ID: encodable_text(message_id),
        }
        if left_out:
            extra[s.ERROR] = f"{error} ({left_out} original attribute(s) too large to keep)"
        if job is not None:
            job.fail(reason, extra.pop(s.ERROR, error), extra)
        else:
            self._record_rejected(message_id, key, reason, extra.pop(s.ERROR, error), extra)
        self._metrics.inc(Counter.FAILED, reason=reason)
        job_logger(_LOGGER, key or "?", message_id).error(
            "sent to the failure path (%s): %s", reason, error
        )

    def review_message(
        self,
        message_id: str,
        data: bytes,
        attributes: Mapping[str, str],
        key: str | None,
        reason: str,
        error: str,
        attempts: int,
    ) -> dict[str, str] | None:
        """The failure message's attributes, within Pub/Sub's limits; None if it cannot fit."""
        originals = {
            encodable_text(k): encodable_text(v)
            for k, v in attributes.items()
            if not k.startswith(LIBRARY_ATTRIBUTE_PREFIX)
        }
        kept, left_out = fit_attributes(originals, reserved=_REVIEW_ATTRIBUTES)
        dropped = len(attributes) - len(kept)
        review = {
            **kept,
            LIBRARY_ATTRIBUTE_PREFIX + "reason": _clip(reason),
            LIBRARY_ATTRIBUTE_PREFIX + "error": _clip(error),
            LIBRARY_ATTRIBUTE_PREFIX + "key": _clip(key if key is not None else ""),
            LIBRARY_ATTRIBUTE_PREFIX + "message_id": _clip(message_id),
            LIBRARY_ATTRIBUTE_PREFIX + "subscription": _clip(self._subscription),
            LIBRARY_ATTRIBUTE_PREFIX + "attempts": str(attempts),
        }
        if dropped or left_out:
            review[LEFT_OUT_ATTRIBUTE] = str(max(dropped, len(left_out)))
        if problems(data, review):
            return None
        return review

    def _record_rejected(
        self, message_id: str, key: str | None, reason: str, error: str, extra: dict[str, Any]
    ) -> None:
        now = now_utc()
        record = {
            s.KEY: display(key) if key is not None else None,
            s.SUBSCRIPTION: self._subscription,
            s.STATUS: Status.FAILED.value,
            s.EPOCH: 0,
            s.ATTEMPTS: 0,
            s.REASON: encodable_text(reason),
            s.ERROR: encodable_text(error),
            s.FIRST_SEEN_AT: now,
            s.FAILED_AT: now,
            s.UPDATED_AT: now,
            s.EXPIRE_AT: now + timedelta(seconds=self._retention_s),
            **extra,
        }
        try:
            self._store.create(rejected_document_id(self._subscription, message_id), record)
        except AlreadyExists:
            pass  # recorded by an earlier delivery of this message


def rejected_document_id(subscription: str, message_id: str) -> str:
    """Record id of a message rejected before it became a job (namespaced apart from jobs)."""
    return document_id(subscription, message_id, namespace="rejected")


def _stored_attributes(attributes: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """The original attributes to keep in the record (in order, within budget) and how many not."""
    kept: dict[str, str] = {}
    used = 0
    for name, value in attributes.items():
        size = len(name.encode("utf-8", "surrogatepass")) + len(
            value.encode("utf-8", "surrogatepass")
        )
        if used + size > _MAX_STORED_ATTRIBUTES_BYTES:
            continue
        used += size
        kept[_stored(name, 1500)] = _stored(value, 64 * 1024)
    return kept, len(attributes) - len(kept)


def _stored(text: str, limit: int) -> str:
    """``text`` escaped to valid UTF-8 (never dropped), then clipped to ``limit`` bytes."""
    return display(encodable_text(text), limit)


def _clip(text: str) -> str:
    """An attribute value of the failure message: escaped, within Pub/Sub's value limit."""
    return _stored(text, MAX_ATTRIBUTE_VALUE_BYTES - 4)
