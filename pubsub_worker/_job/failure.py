"""The reviewed failure path: a ``failed`` record plus a failure topic.

A job that keeps failing (``MAX_ATTEMPTS`` claims), raises
:class:`~pubsub_worker.errors.PermanentError`, or a message that cannot
become a job (missing key attribute, a key reused for another payload) is
sent here instead of being retried forever. For a claimed job the order is
fixed so that nothing is lost on a crash and a failure message goes out only
for a job whose failed record is durable (docs/protocol.md, property
``review-only-failed``, which the protocol's model checks):

1. a fenced write of its document (conditioned on this owner's version, like
   every write of the owner; it renews the Firestore lease): if another owner
   claimed the job meanwhile (or a replay reset it),
   :class:`~pubsub_worker.errors.LostOwnership` is raised here, before
   anything is published, and the new owner alone decides the job's fate;
2. publish its committed outbox entries not sent yet (their steps committed:
   the effect happened), with their effect keys, and mark them sent, in a
   second fenced write when any went out. An entry that still cannot be
   published is not an error here: it stays unsent in the failed record
   (``pubsub-worker jobs show`` lists it) and is published when the job is
   replayed, by the claim of the replayed message, before its handler runs;
3. write the ``failed`` record, fenced like 1, with the original data when it
   fits (so ``pubsub-worker jobs replay`` can revive it) and, when a failure
   message follows, ``review: pending``. An owner that lost the job since 1
   (a pause past its lease) is refused here and publishes nothing; once this
   write lands, no claim takes the job (only a replay revives it);
4. publish the original data and attributes, plus the reason, to
   ``FAILURE_TOPIC`` and wait for the publish;
5. mark the record ``review: sent``, conditioned on the version of 3 (refused:
   marked again on the version read if still this failure, see ``_mark_sent``);
6. only then ack the message.

A delivery whose claim finds the job failed with its review pending (a crash
or a failed publish between 3 and 5) publishes it, marks it sent and acks
(:meth:`FailurePath.publish_pending`); a crash between 5 and 6 acks without
publishing again. Each crash window is in docs/architecture.md ("Failure
path"). If a write of 1, 2 or 3 or the publish of 4 fails, the message is not
acked: it comes back after a backoff (ownership lost: left to the new owner).

A message that never became a job has no owner to lose: its failure message
is published first, then its ``failed`` record is created under its message id
(a redelivery finds the record and publishes nothing new but the duplicate).

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

from pubsub_worker._attributes import (
    ATTEMPTS_ATTRIBUTE,
    ERROR_ATTRIBUTE,
    KEY_ATTRIBUTE,
    LEFT_OUT_ATTRIBUTE,
    LIBRARY_ATTRIBUTE_PREFIX,
    MESSAGE_ID_ATTRIBUTE,
    REASON_ATTRIBUTE,
    REVIEW_ATTRIBUTES,
    SUBSCRIPTION_ATTRIBUTE,
)
from pubsub_worker._support import fences
from pubsub_worker._support.clients import Publish
from pubsub_worker._support.limits import MAX_ATTRIBUTE_VALUE_BYTES, fit_attributes, problems
from pubsub_worker._support.logs import JobLogger, job_logger
from pubsub_worker._support.metrics import Counter, Metrics
from pubsub_worker.errors import FailurePathUnavailable, OutboxUnsent, StoreError
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import (
    AlreadyExists,
    JobRecord,
    JobStore,
    Status,
    Version,
    VersionConflict,
)

from .core import JobCore
from .keys import display, document_id
from .lease import now_utc
from .records import STEPS_BUDGET_BYTES, encodable_text

__all__ = ["MAX_STORED_DATA_BYTES", "FailurePath", "rejected_document_id"]

_LOGGER = logging.getLogger(__name__)

MAX_STORED_DATA_BYTES = 512 * 1024
_MAX_STORED_ATTRIBUTES_BYTES = 128 * 1024
_MARK_ROUNDS = 3
"""Tries of the review's mark, each on the version read after the one before was refused."""


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
        hooks: Hooks | None = None,
    ) -> None:
        self._store = store
        self._hooks = hooks if hooks is not None else Hooks()
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
        job: JobCore | None,
    ) -> None:
        """Record ``failed``, publish for review; the caller acks after this returns.

        With ``job`` the record is the job's own document, written only while
        this owner holds the job, and the failure message goes out after it
        (steps 1 to 5 of the module docstring): a stale owner gets
        :class:`~pubsub_worker.errors.LostOwnership` and publishes nothing for
        review. Without ``job``, the failure message goes out first, then a
        separate record keyed by the message id is created. Raises
        :class:`~pubsub_worker.errors.FailurePathUnavailable` (nothing written)
        when the message can be neither published for review nor kept in its
        record; any error of the publish or the writes propagates (nothing is
        acked).
        """
        log = job_logger(_LOGGER, key or "?", message_id)
        unsent = self._own_and_flush(job, log) if job is not None else 0
        self._hooks.before_review(key, message_id)
        room = job.document_room if job is not None else STEPS_BUDGET_BYTES
        stored = len(data) <= min(MAX_STORED_DATA_BYTES, room)
        review = None
        if self._topic is not None:
            review = self.review_message(
                message_id, data, attributes, key, reason, error, job.attempt if job else 0
            )
        if review is None and not stored:
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
        recorded_error = (
            f"{error} ({left_out} original attribute(s) too large to keep)" if left_out else error
        )
        if job is not None:
            if review is not None:
                extra[s.REVIEW] = s.Review.PENDING.value
            job.fail(reason, recorded_error, extra)  # fenced: a stale owner stops here
            if review is not None:
                self._publish_review(data, review)
                self._mark_sent(job.identity.doc_id, job.document.version, job.epoch, log)
        else:
            if review is not None:
                self._publish_review(data, review)
            self._record_rejected(message_id, key, reason, recorded_error, extra)
        self._metrics.inc(Counter.FAILED, reason=reason)
        log.error("sent to the failure path (%s): %s", reason, error)
        if unsent:
            log.warning(
                "%d outbox entr%s of the failed job not published; published when the job "
                "is replayed (pubsub-worker jobs show lists them)",
                unsent,
                "y" if unsent == 1 else "ies",
            )

    def publish_pending(
        self,
        *,
        message_id: str,
        data: bytes,
        attributes: Mapping[str, str],
        key: str,
        doc_id: str,
        record: JobRecord,
        version: Version | None,
    ) -> None:
        """Publish the failure message of a job found failed with its review pending.

        Called by a delivery whose claim found the job so (the delivery that
        failed it stopped between its failed record and the publish); the
        message is this delivery's own copy of the job's message. The record
        is then marked ``review: sent``. A publish error propagates: the caller
        does not ack, and the message comes back after a backoff.
        """
        log = job_logger(_LOGGER, key, message_id)
        if self._topic is None:
            raise FailurePathUnavailable(
                "the failed job's failure message is still pending (it was failed while "
                "PUBSUB_WORKER_FAILURE_TOPIC was set), but PUBSUB_WORKER_FAILURE_TOPIC is not "
                "set now: set it again so the message is published for review; until then the "
                "message is not acked"
            )
        review = self.review_message(
            message_id,
            data,
            attributes,
            key,
            record.reason or "error",
            record.error or "",
            record.attempts,
        )
        if review is None:
            log.warning(
                "the failed job's failure message is pending, but it does not fit a failure "
                "message; acked without it"
            )
            return
        self._publish_review(data, review)
        self._mark_sent(doc_id, version, record.epoch, log)
        log.warning("published the failed job's pending failure message (%s)", record.reason)

    def _publish_review(self, data: bytes, review: Mapping[str, str]) -> None:
        assert self._topic is not None
        self._publish(self._topic, data, review).result(timeout=self._io_timeout_s)

    def _mark_sent(self, doc_id: str, version: Version | None, epoch: int, log: JobLogger) -> None:
        """Step 5: ``review: sent`` on the failed record's version (the ``review-mark`` fence).

        Refused, it is read again: still this failure (failed at ``epoch``, pending:
        a write that changes no owner, such as an edit by hand, left it so), it is
        marked on the version read; marked by another, or replayed (a new epoch):
        nothing to do. A store error is logged: the message went out and is acked
        (published again only by a delivery that finds it pending, if the ack is lost).
        """
        if version is None:
            return
        changes: dict[tuple[str, ...], Any] = {(s.REVIEW,): s.Review.SENT.value}
        try:
            for _ in range(_MARK_ROUNDS):
                try:
                    self._store.update(doc_id, changes, expected=version)
                    return
                except VersionConflict:
                    snap = self._store.get(doc_id)
                    if snap is None:
                        return
                    if "review-mark" in fences.OFF:  # switched off in a test: write over it
                        self._store.update(doc_id, changes, expected=snap.version)
                        return
                    record = JobRecord.parse(snap.fields)
                    if not (
                        record.status is Status.FAILED
                        and record.epoch == epoch
                        and record.review_pending
                    ):
                        log.debug("the failure message's mark: written by another, or replayed")
                        return
                    version = snap.version
            log.warning("failure message published; its record kept changing, still pending")
        except StoreError as exc:
            log.warning("failure message published; its record still says pending: %s", exc)

    @staticmethod
    def _own_and_flush(job: JobCore, log: JobLogger) -> int:
        """Steps 1 and 2 of the module docstring; how many entries stay unsent.

        Raises :class:`~pubsub_worker.errors.LostOwnership` when another owner
        holds the job (nothing published for review), or a store error.
        """
        document = job.document
        document.write()  # fenced: a stale owner stops here, before any publish
        before = job.unsent_count
        if not before:
            return 0
        try:
            job.publish_unsent()
        except OutboxUnsent as exc:
            log.warning("%s; kept unsent in the failed record", exc)
        if job.unsent_count < before:
            # The sent marks are durable before the review goes out, and ownership is
            # confirmed again after publishes that may have taken a while.
            document.write()
        return job.unsent_count

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
        kept, left_out = fit_attributes(originals, reserved=len(REVIEW_ATTRIBUTES))
        dropped = len(attributes) - len(kept)
        review = {
            **kept,
            REASON_ATTRIBUTE: _clip(reason),
            ERROR_ATTRIBUTE: _clip(error),
            KEY_ATTRIBUTE: _clip(key if key is not None else ""),
            MESSAGE_ID_ATTRIBUTE: _clip(message_id),
            SUBSCRIPTION_ATTRIBUTE: _clip(self._subscription),
            ATTEMPTS_ATTRIBUTE: str(attempts),
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
        doc_id = rejected_document_id(self._subscription, message_id)
        record = {
            s.KEY: display(key) if key is not None else None,
            s.SUBSCRIPTION: self._subscription,
            s.SHARD: s.shard_of(doc_id),
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
            self._store.create(doc_id, record)
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
