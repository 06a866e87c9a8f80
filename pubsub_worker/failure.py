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
between 2 and 3 acks on the redelivery without publishing again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from . import store as s
from .claim import now_utc
from .errors import FailurePathUnavailable
from .job import Job
from .keys import display, document_id
from .metrics import Counter, Metrics
from .store import AlreadyExists, JobStore, Status

__all__ = [
    "MAX_STORED_DATA_BYTES",
    "FailurePath",
    "FailurePathUnavailable",
    "Reason",
]

_LOGGER = logging.getLogger(__name__)

MAX_STORED_DATA_BYTES = 512 * 1024
ATTRIBUTE_PREFIX = "pubsub_worker_"
MAX_ATTRIBUTE_VALUE_BYTES = 1024


class Reason:
    """Why a message went to the failure path (the ``reason`` field and attribute)."""

    ATTEMPTS = "attempts"
    """It failed ``MAX_ATTEMPTS`` times."""
    PERMANENT = "permanent"
    """User code raised ``PermanentError``."""
    MISSING_KEY = "missing_key"
    """The configured key attribute was missing or empty."""
    PAYLOAD_CONFLICT = "payload_conflict"
    """The key was already used for a different payload."""


class FailurePath:
    """Sends a message to review. Safe to call again for the same message."""

    def __init__(
        self,
        *,
        store: JobStore,
        subscription: str,
        publish: Callable[[str, bytes, Mapping[str, str]], Future[str]],
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
        Raises :class:`FailurePathUnavailable` when there is no failure topic
        and the data is too large to keep in the record.
        """
        stored = len(data) <= MAX_STORED_DATA_BYTES
        if self._topic is None and not stored:
            raise FailurePathUnavailable(
                f"message {message_id} ({len(data)} bytes) cannot be kept in its failed record "
                f"(limit {MAX_STORED_DATA_BYTES}) and PUBSUB_WORKER_FAILURE_TOPIC is not set; "
                "it is nacked instead (configure a failure topic or a dead-letter policy)"
            )
        attempts = job.attempt if job is not None else 0
        if self._topic is not None:
            review = dict(attributes)
            review.update(
                {
                    ATTRIBUTE_PREFIX + "reason": reason,
                    ATTRIBUTE_PREFIX + "error": _clip(error),
                    ATTRIBUTE_PREFIX + "key": _clip(key if key is not None else ""),
                    ATTRIBUTE_PREFIX + "message_id": message_id,
                    ATTRIBUTE_PREFIX + "subscription": self._subscription,
                    ATTRIBUTE_PREFIX + "attempts": str(attempts),
                }
            )
            self._publish(self._topic, data, review).result(timeout=self._io_timeout_s)
        extra: dict[str, Any] = {
            s.ATTRIBUTES: json.dumps(dict(attributes)),
            s.DATA: data if stored else None,
            s.MESSAGE_ID: message_id,
        }
        if job is not None:
            job.fail(reason, error, extra)
        else:
            now = now_utc()
            record = {
                s.KEY: display(key) if key is not None else None,
                s.SUBSCRIPTION: self._subscription,
                s.STATUS: Status.FAILED.value,
                s.EPOCH: 0,
                s.ATTEMPTS: 0,
                s.REASON: reason,
                s.ERROR: error,
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
        self._metrics.inc(Counter.FAILED, reason=reason)
        _LOGGER.error(
            "job %s message %s: sent to the failure path (%s): %s",
            display(key or "", 64),
            message_id,
            reason,
            error,
            extra={"job_key": display(key or ""), "message_id": message_id},
        )


def rejected_document_id(subscription: str, message_id: str) -> str:
    """Record id of a message rejected before it became a job (namespaced apart from jobs)."""
    return document_id(subscription, message_id, namespace="rejected")


def _clip(text: str) -> str:
    return display(text, MAX_ATTRIBUTE_VALUE_BYTES - 4)
