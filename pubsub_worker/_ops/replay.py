"""Review and replay of the failure path, fenced like every other write.

:func:`list_failed` reads the failure path's records of a subscription (a
Firestore query, ``subscription == S and status == failed``: the store
protocol has no queries) or, given keys, the documents of those keys by id
(no query: ``key`` needs no index), and parses each through
:class:`~pubsub_worker.stores.base.JobRecord`. :func:`replay` revives them through
the :class:`~pubsub_worker.stores.base.JobStore` protocol only. For each job it
reads the document afresh and decides from what it finds:

=====================================  =========================================
the document                           replay
=====================================  =========================================
gone                                   ``skipped: the record is gone``
rejected before it became a job        ``skipped: rejected before it became a job``
completed                              ``skipped: completed``
running, lease live (server's clock)   ``skipped: running``: its owner is never disturbed
never in the failure path              ``skipped: never in the failure path``
reset by a replay less than            ``skipped: replayed moments ago``
``timeout_s`` ago, nothing since
no data, unreadable attributes, or     ``skipped: <why>``: nothing is written
a message over Pub/Sub's limits
failed; running with a lapsed lease;   reset, then publish: ``replayed``
released after a replay
=====================================  =========================================

The reset is one conditional update on the version just read: ``status``
released, ``epoch`` + 1, ``attempts`` 0, ``replayed_at`` set. The new epoch
fences whoever owned the job before: its next conditional write finds
another version and is rejected, and its settling read finds another epoch.
If anyone wrote between the read and the reset (another replay, a worker),
the reset conflicts and the result is ``skipped: changed meanwhile``, with
nothing published. So two replays of one job at the same time publish once:
one wins the reset; the other conflicts, or reads the winner's reset and
finds it was replayed moments ago.

Only after the reset is the original message published again, with the same
key, so that it meets a ``released`` record (published first, it would meet
a ``failed`` one and be acked unprocessed). The recorded steps stay: the
replayed job skips every step that already took effect. So do its outbox
entries: one the failure path could not publish (its step committed, the
publish failed) is kept unsent, and the claim of the replayed message
publishes it, with its effect key, before the handler runs (while it still
cannot be published, that claim releases the job and the message comes
back after a backoff, no attempt counted). A crash between
reset and publish leaves a record reset by a replay with nothing written
since; once ``timeout_s`` has passed on the server's clock, ``replay --key``
replays it again. A second copy of the message, should one go out (such a
record whose message had gone out after all), is harmless: both carry the
same key and the job runs once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from pubsub_worker._job.failure import rejected_document_id
from pubsub_worker._job.keys import REPLAY_OF_ATTRIBUTE, display, document_id
from pubsub_worker._job.lease import lease_left_s, now_utc
from pubsub_worker._support.clients import Publish
from pubsub_worker._support.limits import check_message
from pubsub_worker.errors import LimitExceeded, StoreError, VersionConflict
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, JobStore, Snapshot, Status

__all__ = [
    "FailedJob",
    "Publish",
    "ReplayOutcome",
    "ReplayResult",
    "list_failed",
    "replay",
    "unknown_keys",
    "why_not_replayable",
]

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class FailedJob:
    """A record of the failure path, as listed (replay reads it again before acting)."""

    doc_id: str
    record: JobRecord

    @property
    def key(self) -> str | None:
        """The job's effect key (clipped for humans), or None for a rejected message."""
        return self.record.key

    @property
    def is_job(self) -> bool:
        """False for a message rejected before it became a job (missing key, payload conflict)."""
        return self.record.epoch > 0

    @property
    def replayable(self) -> bool:
        """Whether the record holds what a replay publishes (it may still be skipped)."""
        return self.is_job and self.record.data is not None and self.record.attributes is not None


class ReplayOutcome(str, Enum):
    """What a replay did with one record."""

    REPLAYED = "replayed"
    """Reset (a new epoch) and its original message published again."""
    DRY_RUN = "dry-run"
    """Would have been replayed; nothing was written or published."""
    SKIPPED = "skipped"
    """Left as it was and nothing published; ``reason`` says why."""
    FAILED = "failed"
    """Reset, but the publish failed; ``reason`` says what to do."""


@dataclass(frozen=True)
class ReplayResult:
    """What happened to one record."""

    job: FailedJob
    kind: ReplayOutcome
    reason: str | None = None

    @property
    def outcome(self) -> str:
        """``replayed``, ``dry-run``, ``skipped: <why>`` or ``failed: <why>``."""
        return self.kind.value if self.reason is None else f"{self.kind.value}: {self.reason}"


def _failed_job(snapshot: Any) -> FailedJob:
    return FailedJob(doc_id=snapshot.id, record=JobRecord.parse(snapshot.to_dict() or {}))


def list_failed(
    client: Any, collection: str, subscription: str, *, keys: Iterable[str] = ()
) -> Iterator[FailedJob]:
    """Failed records of ``subscription``; with ``keys``, the records of those keys.

    Without keys, only ``failed`` records are listed. With keys, each key's
    job document is read by its id, whatever its status, so that
    :func:`replay` can say what it found (``skipped: completed``, ``skipped:
    running``, ...), and so is the record of a message rejected before it
    became a job whose message id is that key (as ``jobs show`` finds it);
    keys without either are left out. One batched read of two documents per
    key, in the keys' order.
    """
    query = client.collection(collection).where(
        filter=FieldFilter(s.SUBSCRIPTION, "==", subscription)
    )
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        by_status = query.where(filter=FieldFilter(s.STATUS, "==", Status.FAILED.value))
        for snapshot in by_status.stream():
            yield _failed_job(snapshot)
        return
    ids = [
        doc_id
        for key in wanted
        for doc_id in (document_id(subscription, key), rejected_document_id(subscription, key))
    ]
    found = {
        snapshot.id: snapshot
        for snapshot in client.get_all([client.collection(collection).document(i) for i in ids])
        if snapshot.exists
    }
    for doc_id in dict.fromkeys(ids):
        if doc_id in found:
            yield _failed_job(found[doc_id])


def unknown_keys(subscription: str, keys: Iterable[str], jobs: Iterable[FailedJob]) -> list[str]:
    """The keys, in order, that none of ``jobs`` (what :func:`list_failed` found) belongs to.

    A key belongs to its job's document or to the record of a message rejected
    before it became a job whose message id is that key. Pure: no I/O.
    """
    found = {job.doc_id for job in jobs}
    return [
        key
        for key in dict.fromkeys(keys)
        if document_id(subscription, key) not in found
        and rejected_document_id(subscription, key) not in found
    ]


def replay(
    store: JobStore,
    jobs: Iterable[FailedJob],
    *,
    topic: str,
    publish: Publish,
    key_attribute: str | None,
    dry_run: bool = False,
    progress: Callable[[int, ReplayResult], None] = lambda _i, _r: None,
    timeout_s: float = 60.0,
) -> list[ReplayResult]:
    """Reset each job (fenced: a new epoch) and publish its original message to ``topic``.

    See the module docstring for what is replayed and what is skipped.
    ``publish`` is waited for up to ``timeout_s``; the same bound tells an
    interrupted replay from one whose message may still be on its way.
    Never raises for one job's outcome: a conflict, a store or publish
    error is that job's result, and the next job is replayed.
    """
    results: list[ReplayResult] = []
    for index, job in enumerate(jobs, start=1):
        kind, reason = _replay_one(
            store, job, topic, publish, key_attribute, dry_run=dry_run, timeout_s=timeout_s
        )
        result = ReplayResult(job, kind, reason)
        _LOGGER.info(
            "replay of %s: %s",
            display(job.key or job.doc_id, 128),
            result.outcome,
            extra={"job_key": display(job.key or "", 128)},
        )
        results.append(result)
        progress(index, result)
    return results


def why_not_replayable(
    record: JobRecord, snapshot: Snapshot, now: datetime, *, timeout_s: float
) -> str | None:
    """Why the job as read must not be reset now, or None if it may be. Pure: no I/O.

    Times are the snapshot's server times wherever the store has them, as
    for leases (:func:`~pubsub_worker._job.claim.lease_left_s`).
    """
    if record.epoch <= 0:
        return f"rejected before it became a job ({record.reason}); fix and republish"
    if record.status is Status.COMPLETED:
        return "completed"
    if record.status is Status.RUNNING:
        left_s = lease_left_s(
            record, now, read_time=snapshot.read_time, update_time=snapshot.update_time
        )
        if left_s > 0:
            return "running"
    if record.failed_at is None:
        return "never in the failure path; its message comes back by itself"
    if record.status is Status.RELEASED and record.replayed_at is not None:
        quiet_s = _quiet_s(record, snapshot, now)
        if quiet_s < timeout_s:
            return (
                f"replayed moments ago ({max(quiet_s, 0.0):.0f} s); its message may be on its "
                f"way: if it never arrives, replay again after {timeout_s:.0f} s"
            )
    if record.data is None:
        return "payload too large to keep; republish it from the failure topic"
    if record.attributes is None:
        return "its stored attributes cannot be read; republish it from the failure topic"
    return None


def _quiet_s(record: JobRecord, snapshot: Snapshot, now: datetime) -> float:
    """Seconds since the last write of the document: server times, else the replay's stamp."""
    if snapshot.read_time is not None and snapshot.update_time is not None:
        return (snapshot.read_time - snapshot.update_time).total_seconds()
    assert record.replayed_at is not None
    return (now - record.replayed_at).total_seconds()


def _attributes(record: JobRecord, key_attribute: str | None) -> dict[str, str]:
    """The attributes to publish: the original ones, plus the key when it was the message id."""
    attributes = dict(record.attributes or {})
    if key_attribute is None and record.key is not None:
        # A new message id would be a new key: carry the old one across.
        attributes[REPLAY_OF_ATTRIBUTE] = record.key
    return attributes


def _replay_one(
    store: JobStore,
    job: FailedJob,
    topic: str,
    publish: Publish,
    key_attribute: str | None,
    *,
    dry_run: bool,
    timeout_s: float,
) -> tuple[ReplayOutcome, str | None]:
    try:
        snapshot = store.get(job.doc_id)
    except StoreError as exc:
        return ReplayOutcome.SKIPPED, f"the job store failed: {exc}"
    if snapshot is None:
        return ReplayOutcome.SKIPPED, "the record is gone"
    record = JobRecord.parse(snapshot.fields)
    now = now_utc()
    why = why_not_replayable(record, snapshot, now, timeout_s=timeout_s)
    if why is not None:
        return ReplayOutcome.SKIPPED, why
    assert record.data is not None
    attributes = _attributes(record, key_attribute)
    try:
        check_message(record.data, attributes)
    except LimitExceeded as exc:
        return ReplayOutcome.SKIPPED, f"{exc}; republish it by hand"
    if dry_run:
        return ReplayOutcome.DRY_RUN, None
    reset: dict[tuple[str, ...], Any] = {
        (s.STATUS,): Status.RELEASED.value,
        (s.EPOCH,): record.epoch + 1,
        (s.ATTEMPTS,): 0,
        (s.LEASE_EXPIRES_AT,): None,
        (s.REPLAYED_AT,): now,
        (s.UPDATED_AT,): now,
        (s.REVIEW,): None,  # the replayed job's own failure, if any, is reviewed afresh
    }
    try:
        store.update(job.doc_id, reset, expected=snapshot.version)
    except VersionConflict:
        return ReplayOutcome.SKIPPED, "changed meanwhile"
    except StoreError as exc:
        # The reset may or may not have landed; either way nothing was published.
        return ReplayOutcome.SKIPPED, (
            f"the job store failed ({exc}); nothing was published: "
            f"replay it again after {timeout_s:.0f} s"
        )
    try:
        publish(topic, record.data, attributes).result(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any publish error is this job's outcome
        return ReplayOutcome.FAILED, (
            f"reset, but publishing failed ({type(exc).__name__}: {exc}); "
            f"replay it again after {timeout_s:.0f} s"
        )
    return ReplayOutcome.REPLAYED, None
