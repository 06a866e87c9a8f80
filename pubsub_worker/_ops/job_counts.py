"""What the dashboard counts: jobs by status, failed jobs by reason, the oldest of a status.

Each count is one Firestore ``count()`` aggregation, answered from an index
without reading a document (real Firestore bills one read per 1,000 index
entries counted): no full scan, whatever the collection holds.

* By status (or all of a subscription's): ``subscription == S [and status ==
  X]``, the query ``failed`` sends, served by merging the two single-field
  indexes of :data:`~pubsub_worker._ops.job_layout.QUERIED_FIELDS`; it counts
  a document written before the shard too.
* By failure reason, or last written before a time (stuck): a listing's own
  query (:func:`~pubsub_worker._ops.listing.listing_query`), served by the
  listing's composite index (``reason`` and ``updated_at`` have no
  single-field index).

Firestore has no ``group by``: failed jobs are counted per reason of
:data:`FAILURE_REASONS`, one aggregation each, and whatever the total of
failed jobs holds beyond them is reported as the rest (:class:`ReasonCounts`).

:func:`oldest` is the first row of a listing sorted oldest first: the running
job whose last write is the oldest, which is the one most likely stuck (a
running job's every step and heartbeat write moves ``updated_at``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.base_query import FieldFilter

from pubsub_worker._job.lease import now_utc
from pubsub_worker._worker.outcome import Reason
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Status

from .job_layout import index_command, list_query_shape
from .jobs import IndexMissing
from .jobs_view import JobView
from .listing import listing_query

__all__ = ["FAILURE_REASONS", "ReasonCounts", "count_jobs", "oldest"]

FAILURE_REASONS: tuple[str, ...] = (
    *(value for name, value in vars(Reason).items() if name.isupper()),
    "error",
)
"""Every ``reason`` the failure path writes (``error``: a failure with no named reason)."""


@dataclass(frozen=True)
class ReasonCounts:
    """Failed jobs of a subscription, per reason."""

    total: int
    by_reason: Mapping[str, int]
    """Reasons with at least one failed job, most first."""

    @classmethod
    def of(cls, total: int, counts: Mapping[str, int]) -> ReasonCounts:
        """From the count of each reason (:func:`count_jobs` with ``reason``)."""
        ordered = sorted(((r, n) for r, n in counts.items() if n), key=lambda rn: -rn[1])
        return cls(total=total, by_reason=dict(ordered))

    @property
    def other(self) -> int:
        """Failed jobs whose reason is none of :data:`FAILURE_REASONS` (written by hand)."""
        return max(self.total - sum(self.by_reason.values()), 0)


def count_jobs(
    client: Any,
    collection: str,
    subscription: str,
    *,
    status: Status | None = None,
    reason: str | None = None,
    older_than_s: float | None = None,
) -> int:
    """How many jobs of ``subscription`` have these, in one aggregation (module docstring).

    ``older_than_s`` counts those last written at least that long ago (with
    ``status`` running: the jobs whose owner stopped writing).

    Raises :class:`~pubsub_worker._ops.jobs.IndexMissing` when real Firestore
    lacks the listing's index, :class:`~pubsub_worker.errors.StoreError` when it
    fails otherwise.
    """
    shape = list_query_shape(status, older_than=older_than_s is not None, reason=reason is not None)
    if reason is None and older_than_s is None:
        query = client.collection(collection).where(
            filter=FieldFilter(s.SUBSCRIPTION, "==", subscription)
        )
        if status is not None:
            query = query.where(filter=FieldFilter(s.STATUS, "==", status.value))
    else:
        query = listing_query(
            client,
            collection,
            subscription,
            status=status,
            reason=reason,
            older_than_s=older_than_s,
        )
    try:
        answer = query.count(alias="n").get()
    except gexc.FailedPrecondition as exc:
        raise IndexMissing(index_command(collection, shape.index()), str(exc)) from exc
    except gexc.GoogleAPICallError as exc:
        raise StoreError(f"counting jobs failed: {exc}") from exc
    return int(answer[0][0].value)


def oldest(
    client: Any, collection: str, subscription: str, status: Status, now: datetime | None = None
) -> JobView | None:
    """The job of ``status`` whose last write is the oldest, or None when there is none."""
    query = listing_query(client, collection, subscription, status=status, oldest_first=True)
    shape = list_query_shape(status, older_than=False, oldest_first=True)
    try:
        snapshots = list(query.limit(1).stream())
    except gexc.FailedPrecondition as exc:
        raise IndexMissing(index_command(collection, shape.index()), str(exc)) from exc
    except gexc.GoogleAPICallError as exc:
        raise StoreError(f"listing jobs failed: {exc}") from exc
    if not snapshots:
        return None
    snap = snapshots[0]
    return JobView.from_fields(
        snap.id,
        snap.to_dict() or {},
        now or now_utc(),
        read_time=snap.read_time,
        update_time=snap.update_time,
    )
