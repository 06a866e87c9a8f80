"""Failed jobs counted by reason: the dashboard's review queue.

Firestore has no ``group by``: failed jobs are counted per reason of
:data:`FAILURE_REASONS`, one ``count()`` each on the listing index
(:meth:`~pubsub_worker.stores.job_index.JobIndex.count` with ``reason``, served
on real Firestore by the reason index of
:data:`~pubsub_worker.stores.layout.DASHBOARD_INDEXES`; only documents that
ever failed carry ``reason``, so only they have entries). Whatever the total
of failed jobs holds beyond them is reported as the rest
(:attr:`ReasonCounts.other`). Counts by status, the stuck and the oldest
running job are :func:`~pubsub_worker._ops.stats.job_stats`.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from pubsub_worker.stores.base import Reason, Status
from pubsub_worker.stores.job_index import JobIndex

__all__ = ["FAILURE_REASONS", "ReasonCounts", "reason_counts"]

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
        """From the count of each reason."""
        ordered = sorted(((r, n) for r, n in counts.items() if n), key=lambda rn: -rn[1])
        return cls(total=total, by_reason=dict(ordered))

    @property
    def other(self) -> int:
        """Failed jobs whose reason is none of :data:`FAILURE_REASONS` (written by hand)."""
        return max(self.total - sum(self.by_reason.values()), 0)


def reason_counts(index: JobIndex, executor: Executor | None = None) -> ReasonCounts:
    """The failed jobs of ``index``'s subscription, in all and per reason (sent at once with
    an ``executor``). Raises what :meth:`JobIndex.count` raises."""
    if executor is None:
        total = index.count(Status.FAILED)
        counts = {r: index.count(Status.FAILED, reason=r) for r in FAILURE_REASONS}
        return ReasonCounts.of(total, counts)
    pending = executor.submit(index.count, Status.FAILED)
    futures = {r: executor.submit(index.count, Status.FAILED, reason=r) for r in FAILURE_REASONS}
    return ReasonCounts.of(pending.result(), {r: f.result() for r, f in futures.items()})
