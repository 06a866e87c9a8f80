"""How a subscription's jobs stand: counts by status, the oldest running job, pending reviews.

:func:`job_stats` is ``pubsub-worker jobs stats`` and what a dashboard shows.
It reads through a :class:`JobIndex`, the listing index of one subscription
(:class:`FirestoreJobIndex` on Firestore, :class:`MemoryJobIndex` on the
in-memory store), and never scans the collection. On Firestore every query
is one the listing indexes serve
(:data:`~pubsub_worker._ops.job_layout.LIST_INDEXES`, the second one:
``subscription, status, shard, updated_at desc``)::

    count()   where subscription == S and status == X and shard in [0 .. SHARDS - 1]
              [and updated_at < T]
    documents where ... (the same) order by updated_at desc, __name__ desc limit N

* **Counts by status**: one aggregation ``count()`` per status; Firestore
  bills one read per 1,000 index entries counted (at least one per query).
* **The oldest running job** (the one written longest ago: the stuck
  candidate): the index is ordered newest first, and reading it to its end
  would be a read per running job. So it is found by counting: starting
  from the newest running job, ``count(updated_at < T)`` steps back (1 s,
  then 4 times further each time) until no job is older, then halves the
  interval until exactly one job is older than ``T``, and that one is read
  (``updated_at < T``, newest first, limit 1). About ``log2(age / gap)``
  counts, where gap is the time between the two oldest; at most
  :data:`MAX_COUNTS`.
* **Pending reviews** (failed jobs whose failure message is not published
  yet, ``review: pending``): ``review`` is exempt from indexing, so no query
  may filter on it; the ``review`` field of the most recently written failed
  jobs is read instead (one read each, at most ``review_reads``), which is
  where a pending review is (the next delivery of its message publishes it).
  :attr:`JobStats.reviews_read` says how many were read.

A job document without a shard (written before the field) is in no count
until ``jobs backfill-shards`` gives it its shard, as for ``jobs list``. The
queries are not one snapshot: a job written while they run may be counted
under its old status or its new one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.base_query import FieldFilter

from pubsub_worker._job.lease import now_utc
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Review, Status
from pubsub_worker.stores.memory import MemoryJobStore

from .job_layout import index_command, list_query_shape
from .jobs import IndexMissing
from .jobs_view import JobView

__all__ = [
    "MAX_COUNTS",
    "REVIEW_READS",
    "FirestoreJobIndex",
    "JobIndex",
    "JobStats",
    "MemoryJobIndex",
    "Row",
    "job_stats",
]

MAX_COUNTS = 64
"""Count queries the search for the oldest running job sends at most."""

REVIEW_READS = 100
"""Failed jobs, most recently written first, whose ``review`` field :func:`job_stats` reads."""

_TICK = timedelta(microseconds=1)
"""Firestore's resolution of a timestamp."""
_FLOOR = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Row:
    """One job document as a query returned it."""

    doc_id: str
    fields: Mapping[str, Any]
    read_time: datetime | None = None
    update_time: datetime | None = None


class JobIndex(Protocol):
    """The listing index of one subscription's jobs: what :func:`job_stats` reads.

    Both methods see only documents of the subscription that have a shard,
    ordered by ``updated_at``; ``before`` keeps those last written earlier.
    """

    subscription: str

    def count(self, status: Status, *, before: datetime | None = None) -> int:
        """How many jobs have ``status`` (and were last written before ``before``)."""
        ...

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        """The ``limit`` most recently written of them, newest first (``fields`` only, if given)."""
        ...


@dataclass(frozen=True)
class JobStats:
    """How the jobs of :attr:`subscription` stood at :attr:`at` (this machine's clock)."""

    subscription: str
    at: datetime
    counts: dict[Status, int]
    """Jobs per status, every status present (0 included)."""
    oldest_running: JobView | None
    """The running job written longest ago (its lease on Firestore's clock), or None."""
    reviews_pending: int
    """Failed jobs read whose failure message is not published yet."""
    reviews_read: int
    """Failed jobs whose ``review`` was read: all of them when it equals ``counts[FAILED]``."""

    @property
    def total(self) -> int:
        """Jobs of every status."""
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types; the oldest running job as :meth:`JobView.to_json` gives it."""
        return {
            "subscription": self.subscription,
            "at": self.at.isoformat(),
            "counts": {status.value: n for status, n in self.counts.items()},
            "total": self.total,
            "oldest_running": (
                self.oldest_running.to_json() if self.oldest_running is not None else None
            ),
            "reviews_pending": self.reviews_pending,
            "reviews_read": self.reviews_read,
        }


def job_stats(
    index: JobIndex, *, review_reads: int = REVIEW_READS, now: datetime | None = None
) -> JobStats:
    """Counts by status, the oldest running job and the pending reviews; see the module.

    Raises :class:`~pubsub_worker._ops.jobs.IndexMissing` when real Firestore
    lacks the listing index and :class:`~pubsub_worker.errors.StoreError`
    when it fails otherwise.
    """
    now = now or now_utc()
    counts = {status: index.count(status) for status in Status}
    oldest = _oldest(index, Status.RUNNING) if counts[Status.RUNNING] else None
    reviews: list[Row] = []
    if counts[Status.FAILED] and review_reads > 0:
        reviews = index.newest(Status.FAILED, limit=review_reads, fields=(s.REVIEW,))
    return JobStats(
        subscription=index.subscription,
        at=now,
        counts=counts,
        oldest_running=(
            JobView.from_fields(
                oldest.doc_id,
                oldest.fields,
                now,
                read_time=oldest.read_time,
                update_time=oldest.update_time,
            )
            if oldest is not None
            else None
        ),
        reviews_pending=sum(1 for r in reviews if r.fields.get(s.REVIEW) == Review.PENDING.value),
        reviews_read=len(reviews),
    )


def _oldest(index: JobIndex, status: Status) -> Row | None:
    """The job of ``status`` written longest ago, found by counting (see the module)."""
    newest = index.newest(status, limit=1, fields=(s.UPDATED_AT,))
    last = _updated_at(newest[0]) if newest else None
    if last is None:
        return None
    hi = last + _TICK  # every job of the status is older than hi, as far as counted
    older = index.count(status, before=hi)
    lo: datetime | None = None  # no job is older than lo, once known
    step = timedelta(seconds=1)
    for _ in range(MAX_COUNTS):
        if older <= 1:
            break
        if lo is None:  # step back until no job is older
            probe = max(hi - step, _FLOOR)
            step *= 4
        else:  # halve [lo, hi)
            probe = lo + (hi - lo) // 2
            if probe <= lo:
                break
        found = index.count(status, before=probe)
        if found == 0:
            lo = probe
        else:
            hi, older = probe, found
        if lo is None and probe == _FLOOR:
            lo = _FLOOR
    rows = index.newest(status, before=hi, limit=1)
    return rows[0] if rows else None


def _updated_at(row: Row) -> datetime | None:
    value = row.fields.get(s.UPDATED_AT)
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


class FirestoreJobIndex:
    """:class:`JobIndex` on a Firestore collection: the queries of the module docstring."""

    def __init__(self, client: Any, collection: str, subscription: str) -> None:
        self._client = client
        self._collection = collection
        self.subscription = subscription

    def _query(self, status: Status, before: datetime | None) -> Any:
        query = (
            self._client.collection(self._collection)
            .where(filter=FieldFilter(s.SUBSCRIPTION, "==", self.subscription))
            .where(filter=FieldFilter(s.STATUS, "==", status.value))
            .where(filter=FieldFilter(s.SHARD, "in", list(range(s.SHARDS))))
        )
        if before is not None:
            query = query.where(filter=FieldFilter(s.UPDATED_AT, "<", before))
        return query

    def _failed(self, status: Status, before: datetime | None, exc: Exception) -> Exception:
        if isinstance(exc, gexc.FailedPrecondition):
            shape = list_query_shape(status, older_than=before is not None)
            return IndexMissing(index_command(self._collection, shape.index()), str(exc))
        return StoreError(f"counting the {status.value} jobs of {self.subscription} failed: {exc}")

    def count(self, status: Status, *, before: datetime | None = None) -> int:
        try:
            results = self._query(status, before).count(alias="n").get()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise self._failed(status, before, exc) from exc
        return int(results[0][0].value)

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        query = (
            self._query(status, before)
            .order_by(s.UPDATED_AT, direction="DESCENDING")
            .order_by("__name__", direction="DESCENDING")
            .limit(limit)
        )
        if fields is not None:
            query = query.select(list(fields))
        try:
            snapshots = list(query.stream())
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise self._failed(status, before, exc) from exc
        return [
            Row(snap.id, snap.to_dict() or {}, snap.read_time, snap.update_time)
            for snap in snapshots
        ]


class MemoryJobIndex:
    """:class:`JobIndex` on the in-memory store: the same answers, by reading every document."""

    def __init__(self, store: MemoryJobStore, subscription: str) -> None:
        self._store = store
        self.subscription = subscription

    def _rows(self, status: Status, before: datetime | None) -> list[Row]:
        rows = []
        for doc_id, snapshot in self._store.snapshots().items():
            fields = snapshot.fields
            row = Row(doc_id, fields, snapshot.read_time, snapshot.update_time)
            if (
                fields.get(s.SUBSCRIPTION) != self.subscription
                or fields.get(s.STATUS) != status.value
                or fields.get(s.SHARD) is None
            ):
                continue
            updated = _updated_at(row)
            if before is not None and (updated is None or updated >= before):
                continue
            rows.append(row)
        return rows

    def count(self, status: Status, *, before: datetime | None = None) -> int:
        return len(self._rows(status, before))

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        rows = [row for row in self._rows(status, before) if _updated_at(row) is not None]
        rows.sort(key=lambda row: (_updated_at(row), row.doc_id), reverse=True)
        if fields is not None:
            rows = [
                Row(
                    r.doc_id,
                    {f: r.fields[f] for f in fields if f in r.fields},
                    r.read_time,
                    r.update_time,
                )
                for r in rows
            ]
        return rows[:limit]
