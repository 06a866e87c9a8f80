"""What the dashboard's pages show, as read: a subscription, its numbers, a page, one job.

Plain values built by :class:`~pubsub_worker.ui.jobs.Jobs` and rendered by the
templates; nothing here reads or writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsub_worker._ops import job_counts
from pubsub_worker._ops.jobs_view import JobView
from pubsub_worker._ops.stats import JobStats
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import JobRecord, Status

__all__ = ["Counts", "JobDetail", "ListPage", "Review", "Subscription"]


@dataclass(frozen=True)
class Subscription:
    """A subscription the dashboard shows, with the settings the CLI would use for it."""

    index: int
    settings: Settings

    @property
    def path(self) -> str:
        return self.settings.subscription_path

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Counts:
    """A subscription's numbers: ``jobs stats`` (all 0 when its index is ``missing``)."""

    by_status: dict[Status, int]
    stuck: int
    """Running jobs whose last write is older than a lease: their owner stopped writing."""
    oldest_running: JobView | None
    reviews_pending: int = 0
    """Of the newest failed jobs read, those whose failure message is not published yet."""
    missing: tuple[str, ...] = ()
    """Commands that create the composite indexes real Firestore asked for."""

    @classmethod
    def of(cls, stats: JobStats) -> Counts:
        return cls(
            by_status=stats.counts,
            stuck=stats.stuck or 0,
            oldest_running=stats.oldest_running,
            reviews_pending=stats.reviews_pending,
        )

    @classmethod
    def unknown(cls, missing: str) -> Counts:
        """Nothing counted: real Firestore lacks the index ``missing`` creates."""
        return cls(dict.fromkeys(Status, 0), 0, None, missing=(missing,))

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True)
class Review:
    """The review queue: failed jobs counted by reason, and the newest of each reason."""

    reasons: job_counts.ReasonCounts
    samples: dict[str, list[JobView]]
    """Of the newest failed jobs (:data:`~pubsub_worker.ui.jobs.SAMPLED`), those of each
    reason."""
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListPage:
    """A page of the job list: its rows, the cursor of the next, what a key prefix read."""

    jobs: list[JobView]
    next: str | None
    scanned: int
    """Documents read for the page (more than its rows when a key prefix filters)."""
    exact: JobView | None = None
    """The job whose key is exactly the prefix, read by id."""


@dataclass(frozen=True)
class JobDetail:
    """One job's whole story: its view, its record, and what may be done with it."""

    view: JobView
    record: JobRecord
    subscription: Subscription | None
    replay_refusal: str | None
    """Why a replay would skip it now (``None``: it may be replayed)."""
    release_refusal: str | None
    """Why it cannot be released from here (``None``: it may be released)."""

    @property
    def payload_bytes(self) -> int | None:
        return len(self.record.data) if self.record.data is not None else None
