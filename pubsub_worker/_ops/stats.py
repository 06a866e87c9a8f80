"""How a subscription's jobs stand: counts by status, the oldest running job, pending reviews.

:func:`job_stats` is ``pubsub-worker jobs stats`` and the dashboard's overview.
It reads through a :class:`JobIndex`, the listing index of one subscription
(:class:`FirestoreJobIndex` on Firestore, :class:`MemoryJobIndex` on the
in-memory store), and never scans the collection. On Firestore every query
is one the listing indexes serve
(:data:`~pubsub_worker.stores.layout.LIST_INDEXES`, the second one:
``subscription, status, shard, updated_at desc``; with a failure reason,
:data:`~pubsub_worker.stores.layout.DASHBOARD_INDEXES`)::

    count()   where subscription == S and status == X [and reason == R]
              and shard in [0 .. SHARDS - 1] [and updated_at < T]
    documents where ... (the same) order by updated_at desc, __name__ desc limit N

* **Counts by status**: one aggregation ``count()`` per status (sent at once
  when an executor is given); Firestore bills one read per 1,000 index
  entries counted (at least one per query). **Stuck**: the running jobs last
  written over ``stuck_after_s`` ago (their owner stopped writing), one more.
* **The oldest running job** (the one written longest ago: the stuck
  candidate): the index is ordered newest first. When at most
  :data:`OLDEST_READS` jobs are running, their ``updated_at`` is read newest
  first and the last one is the oldest (one query). With more, reading the
  index to its end would be a read per running job, so it is found by
  counting: starting from the newest running job, ``count(updated_at < T)``
  steps back (1 s, then 4 times further each time) until no job is older,
  then halves the interval until exactly one job is older than ``T``, and that
  one is read (``updated_at < T``, newest first, limit 1). About
  ``log2(age / gap)`` counts, where gap is the time between the two oldest;
  at most :data:`MAX_COUNTS`.
* **Pending reviews** (failed jobs whose failure message is not published
  yet, ``review: pending``): ``review`` is exempt from indexing, so no query
  may filter on it; the ``review`` field of the most recently written failed
  jobs is read instead (one read each, at most ``review_reads``), which is
  where a pending review is (the next delivery of its message publishes it).
  :attr:`JobStats.reviews_read` says how many were read.

The queries are not one snapshot: a job written while they run may be
counted under its old status or its new one.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pubsub_worker._job.lease import now_utc
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Review, Status
from pubsub_worker.stores.job_index import (
    REVIEW_READS,
    FirestoreJobIndex,
    JobIndex,
    MemoryJobIndex,
    Row,
    updated_at,
)

from .jobs_view import JobView

__all__ = [
    "MAX_COUNTS",
    "OLDEST_READS",
    "FirestoreJobIndex",
    "JobIndex",
    "JobStats",
    "MemoryJobIndex",
    "Row",
    "job_stats",
]

MAX_COUNTS = 64
"""Count queries the search for the oldest running job sends at most."""

OLDEST_READS = 200
"""Running jobs up to which the oldest is found by reading their ``updated_at`` (one query)."""

_TICK = timedelta(microseconds=1)
"""Firestore's resolution of a timestamp."""
_FLOOR = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
    stuck: int | None = None
    """Running jobs last written over ``stuck_after_s`` ago (None: not counted)."""
    stuck_after_s: float | None = None

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
            "stuck": self.stuck,
            "stuck_after_s": self.stuck_after_s,
        }


def job_stats(
    index: JobIndex,
    *,
    review_reads: int = REVIEW_READS,
    stuck_after_s: float | None = None,
    now: datetime | None = None,
    executor: Executor | None = None,
) -> JobStats:
    """Counts by status, the stuck ones, the oldest running job and the pending reviews.

    See the module. With an ``executor`` the counts are sent at once, and the
    search for the oldest beside the review reads. Raises
    :class:`~pubsub_worker.stores.layout.IndexMissing` when real Firestore lacks
    the listing index and :class:`~pubsub_worker.errors.StoreError` when it
    fails otherwise.
    """
    now = now or now_utc()
    run = _runner(executor)
    stuck_before = now - timedelta(seconds=stuck_after_s) if stuck_after_s is not None else None
    counted = {status: run(index.count, status) for status in Status}
    stuck = (
        run(lambda: index.count(Status.RUNNING, before=stuck_before))
        if stuck_before is not None
        else None
    )
    counts = {status: answer() for status, answer in counted.items()}
    oldest = run(_oldest, index, Status.RUNNING) if counts[Status.RUNNING] else None
    reviews: list[Row] = []
    if counts[Status.FAILED] and review_reads > 0:
        reviews = index.newest(Status.FAILED, limit=review_reads, fields=(s.REVIEW,))
    found = oldest() if oldest is not None else None
    return JobStats(
        subscription=index.subscription,
        at=now,
        counts=counts,
        oldest_running=(
            JobView.from_fields(
                found.doc_id,
                found.fields,
                now,
                read_time=found.read_time,
                update_time=found.update_time,
            )
            if found is not None
            else None
        ),
        reviews_pending=sum(1 for r in reviews if r.fields.get(s.REVIEW) == Review.PENDING.value),
        reviews_read=len(reviews),
        stuck=stuck() if stuck is not None else None,
        stuck_after_s=stuck_after_s,
    )


def _runner(executor: Executor | None) -> Callable[..., Callable[[], Any]]:
    """``run(f, *args)``: started now (in ``executor``, if any); its answer when called."""

    def run(function: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        if executor is None:
            answer = function(*args)
            return lambda: answer
        return executor.submit(function, *args).result

    return run


def _oldest(index: JobIndex, status: Status) -> Row | None:
    """The job of ``status`` written longest ago: read when few, else found by counting."""
    latest = index.newest(status, limit=OLDEST_READS + 1, fields=(s.UPDATED_AT,))
    if not latest or updated_at(latest[0]) is None:
        return None
    if len(latest) <= OLDEST_READS:  # every one of them: the last is the oldest
        last = updated_at(latest[-1])
        assert last is not None  # listed: ordered by it
        rows = index.newest(status, before=last + _TICK, limit=1)
        return rows[0] if rows else None
    return _search_oldest(index, status, updated_at(latest[0]))


def _search_oldest(index: JobIndex, status: Status, last: datetime | None) -> Row | None:
    """The job of ``status`` written longest ago, found by counting (see the module)."""
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
