"""Job inspection and release: what ``pubsub-worker jobs`` reads and the one write it makes.

:func:`show` reads one job through the :class:`~pubsub_worker.stores.base.JobStore`
protocol (the document id is derived from the key, as a worker derives it)
and turns it into a :class:`~pubsub_worker._ops.jobs_view.JobView`: status,
epoch, owner, the lease left on Firestore's clock, every step with its time
and size, the outbox and the last error. How a view is shown (text, table,
JSON) is :mod:`pubsub_worker._ops.jobs_view`.

:func:`list_jobs` is one Firestore query per page, newest first::

    where subscription == S [and status == X] and shard in [0 .. SHARDS - 1]
          [and updated_at < now - AGE]
    order by updated_at desc, __name__ desc   limit N [start after the cursor]

Real Firestore answers it only from a composite index (the emulator asks
for none): :data:`~pubsub_worker.stores.layout.LIST_INDEXES`, the shard
before ``updated_at``, so a subscription's writes land at the ends of
:data:`~pubsub_worker.stores.base.SHARDS` index ranges, not one (each takes
Firestore's 500 writes per second for sequential values). The ``in`` filter
is one query whose shards Firestore merges by ``updated_at``: the rows,
their order and the cursor are those of one unsharded range.
:func:`list_query_shape` names the index a listing uses (a unit test checks
each has one); without it production answers ``FailedPrecondition``,
reported as :class:`IndexMissing` with the command that creates it. A page
ends with a cursor (:class:`Page.next`): the last row's ``updated_at`` and
document id, so paging is stable while jobs are written and costs one read
per row shown.

:func:`release` drops a stuck owner's claim: one conditional update on the
version just read (``status`` released, ``epoch`` + 1, the lease cleared,
steps, outbox and attempts kept). The owner's next conditional write finds
another version, and its settling read another epoch, so it stops without
committing or acking; the next delivery claims the job at a newer epoch and
skips every recorded step. Completed and failed jobs are refused (a failed
one is replayed, not released). ``expect_epoch`` (``--expect-epoch``) aims the
release at the claim the operator saw: the ``expect-epoch`` fence
(:mod:`pubsub_worker._support.fences`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_worker._job.failure import rejected_document_id
from pubsub_worker._job.keys import document_id
from pubsub_worker._job.lease import now_utc
from pubsub_worker._support import fences
from pubsub_worker.errors import StoreError, VersionConflict
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobStore, Status
from pubsub_worker.stores.layout import IndexMissing, index_command, list_query_shape

from .jobs_view import JobView
from .listing import listing_query

__all__ = [
    "Page",
    "ReleaseOutcome",
    "ReleaseResult",
    "decode_cursor",
    "encode_cursor",
    "list_jobs",
    "release",
    "show",
]


# -- show ---------------------------------------------------------------------------


def show(store: JobStore, subscription: str, key: str) -> JobView | None:
    """The job of ``key`` on ``subscription``, or ``None`` when there is none.

    When no job has that key, a message rejected before it became a job
    (missing key attribute, payload conflict) is looked up with ``key`` as
    its message id. Raises :class:`~pubsub_worker.errors.StoreError` when
    the store fails.
    """
    for doc_id in (document_id(subscription, key), rejected_document_id(subscription, key)):
        snapshot = store.get(doc_id)
        if snapshot is not None:
            return JobView.from_snapshot(doc_id, snapshot, now_utc())
    return None


# -- list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of a listing, newest first, and the cursor of the next (None: the last)."""

    jobs: list[JobView]
    next: str | None


def encode_cursor(updated_at: datetime, doc_id: str) -> str:
    """A page cursor: microseconds since the epoch and the document id (shell-safe)."""
    micros = round((updated_at - _EPOCH) / timedelta(microseconds=1))
    return f"{micros}-{doc_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The ``(updated_at, doc_id)`` of a cursor; ``ValueError`` when it is not one."""
    micros, sep, doc_id = cursor.partition("-")
    if not sep or not doc_id or not micros.isdigit():
        raise ValueError(f"not a page cursor: {cursor!r}")
    return _EPOCH + timedelta(microseconds=int(micros)), doc_id


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def list_jobs(
    client: Any,
    collection: str,
    subscription: str,
    *,
    status: Status | None = None,
    reason: str | None = None,
    older_than_s: float | None = None,
    limit: int = 50,
    after: str | None = None,
    now: datetime | None = None,
) -> Page:
    """One page of the jobs of ``subscription``, most recently written first.

    ``older_than_s`` keeps jobs whose last write (``updated_at``, the
    writer's clock) is at least that old: stuck ones, with ``status``
    running. ``reason`` keeps failed jobs of that reason (with ``status``
    failed). ``after`` is the cursor of the previous page. Raises
    :class:`IndexMissing` when real Firestore lacks the query's index and
    :class:`~pubsub_worker.errors.StoreError` when it fails otherwise.
    """
    now = now or now_utc()
    shape = list_query_shape(status, older_than=older_than_s is not None, reason=reason is not None)
    query = listing_query(
        client,
        collection,
        subscription,
        status=status,
        reason=reason,
        older_than_s=older_than_s,
        now=now,
    )
    if after is not None:
        updated_at, doc_id = decode_cursor(after)
        query = query.start_after({s.UPDATED_AT: updated_at, "__name__": doc_id})
    # One more than a page: whether there is a next page, without a second query.
    query = query.limit(limit + 1)
    try:
        snapshots = list(query.stream())
    except gexc.FailedPrecondition as exc:
        raise IndexMissing(index_command(collection, shape.index()), str(exc)) from exc
    except gexc.GoogleAPICallError as exc:
        raise StoreError(f"listing jobs failed: {exc}") from exc
    jobs = [
        JobView.from_fields(
            snap.id,
            snap.to_dict() or {},
            now,
            read_time=snap.read_time,
            update_time=snap.update_time,
        )
        for snap in snapshots[:limit]
    ]
    last = jobs[-1] if jobs else None
    cursor = None
    if len(snapshots) > limit and last is not None and last.updated_at is not None:
        cursor = encode_cursor(last.updated_at, last.doc_id)
    return Page(jobs=jobs, next=cursor)


# -- release ------------------------------------------------------------------------


class ReleaseOutcome(str, Enum):
    """What ``jobs release`` did."""

    RELEASED = "released"
    """The claim was dropped: a new epoch, status released; the old owner is fenced."""
    ALREADY_RELEASED = "already released"
    """No owner held the job; nothing was written."""
    REFUSED = "refused"
    """Completed, failed, rejected or not at the expected epoch: nothing was written."""
    NOT_FOUND = "not found"
    """No job has that key on this subscription."""
    CONFLICT = "changed meanwhile"
    """Someone wrote between the read and the release: nothing was written; look again."""


@dataclass(frozen=True)
class ReleaseResult:
    """The outcome of :func:`release`, the job as read before, and what to tell the operator."""

    kind: ReleaseOutcome
    detail: str
    before: JobView | None = None
    epoch: int | None = None
    """The job's epoch after the release (RELEASED), else as read."""

    @property
    def ok(self) -> bool:
        """Whether the job is released now (by this call or before it)."""
        return self.kind in (ReleaseOutcome.RELEASED, ReleaseOutcome.ALREADY_RELEASED)


def release(
    store: JobStore, subscription: str, key: str, *, expect_epoch: int | None = None
) -> ReleaseResult:
    """Drop the current owner's claim of ``key``'s job, fenced; see the module docstring.

    ``expect_epoch`` releases only if the job is still at that epoch (what an
    operator saw in ``jobs show``), so a healthy owner that claimed it since
    is left alone. Raises :class:`~pubsub_worker.errors.StoreError` when the
    store fails before anything was written; a failed write is reported as
    that error too (it may or may not have landed: ``jobs show`` tells).
    """
    doc_id = document_id(subscription, key)
    snapshot = store.get(doc_id)
    if snapshot is None:
        rejected = show(store, subscription, key)
        if rejected is not None:
            return ReleaseResult(
                ReleaseOutcome.REFUSED,
                f"rejected before it became a job ({rejected.reason}): there is no claim to "
                "release; fix the message and publish it again",
                rejected,
                rejected.epoch,
            )
        return ReleaseResult(ReleaseOutcome.NOT_FOUND, f"no job has this key on {subscription}")
    now = now_utc()
    view = JobView.from_snapshot(doc_id, snapshot, now)
    refusal = _why_not(view, expect_epoch)
    if refusal is not None:
        kind, detail = refusal
        return ReleaseResult(kind, detail, view, view.epoch)
    changes: dict[tuple[str, ...], Any] = {
        (s.STATUS,): Status.RELEASED.value,
        (s.EPOCH,): view.epoch + 1,
        (s.LEASE_EXPIRES_AT,): None,
        (s.UPDATED_AT,): now,
    }
    try:
        store.update(doc_id, changes, expected=snapshot.version)
    except VersionConflict:
        return ReleaseResult(
            ReleaseOutcome.CONFLICT,
            "the job was written between the read and the release; nothing was written: "
            "look again (jobs show) and release again if it is still stuck",
            view,
            view.epoch,
        )
    except StoreError as exc:
        raise StoreError(f"{exc}; the release may or may not have landed: jobs show tells") from exc
    return ReleaseResult(ReleaseOutcome.RELEASED, "", view, view.epoch + 1)


def _why_not(view: JobView, expect_epoch: int | None) -> tuple[ReleaseOutcome, str] | None:
    if not view.is_job:
        return ReleaseOutcome.REFUSED, (
            f"rejected before it became a job ({view.reason}): there is no claim to release"
        )
    if view.status is Status.COMPLETED:
        return ReleaseOutcome.REFUSED, (
            "completed: nothing to release (a redelivery is acked without running anything)"
        )
    if view.status is Status.FAILED:
        return ReleaseOutcome.REFUSED, (
            "in the failure path: nothing to release; run it again with "
            "`pubsub-worker jobs replay KEY`"
        )
    if expect_epoch is not None and view.epoch != expect_epoch and "expect-epoch" not in fences.OFF:
        return ReleaseOutcome.REFUSED, (
            f"at epoch {view.epoch}, not {expect_epoch}: it was claimed or released since; "
            "look again (jobs show)"
        )
    if view.status is Status.RELEASED:
        return ReleaseOutcome.ALREADY_RELEASED, (
            f"already released at epoch {view.epoch}: no owner holds it; its next delivery "
            "claims it"
        )
    return None
