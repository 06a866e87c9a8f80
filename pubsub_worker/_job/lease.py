"""The Firestore lease of a job, and the clock it is judged on.

The claim stores the lease length (``lease_seconds``) and every fenced write
of the owner moves the document's update time, which renews the lease: a job
is live while ``update_time + lease_seconds`` is ahead of the reader's read
time (:func:`lease_left_s`). Both times come from the server, so a worker
whose wall clock is off by a minute decides exactly as one whose clock is
right. ``lease_expires_at`` is still written, from the writer's clock
(:func:`lease_fields`): for humans, and for a store without a clock, whose
snapshots carry no server times, so leases are judged on the wall clock.

Who renews it: the claim; each step commit and the completion
(:mod:`pubsub_worker._job.fencing`); a step recorded lazily when a third of a
lease has passed (:data:`RENEW_AFTER`, :func:`renewal_due`); ``heartbeat()``;
and the lease keeper while the job progresses or its message is held
(``keep_alive`` in :mod:`pubsub_worker._job.ownership`). The Pub/Sub lease is
the other one, in :mod:`pubsub_worker._delivery.lease`.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord

__all__ = ["RENEW_AFTER", "lease_fields", "lease_left_s", "now_utc", "renewal_due"]

RENEW_AFTER = 1 / 3
"""A write renews the lease once this fraction of it passed since the owner's last write."""


def now_utc() -> datetime:
    """The current time, timezone-aware (Firestore stores UTC timestamps)."""
    return datetime.now(timezone.utc)


def lease_left_s(
    record: JobRecord,
    now: datetime,
    *,
    read_time: datetime | None = None,
    update_time: datetime | None = None,
) -> float:
    """Seconds the current claim's lease still runs (zero or less: expired). Pure.

    With the snapshot's server times this is ``update_time + lease_s -
    read_time``: the owner's last write renewed the lease, and ``now`` (this
    process's wall clock) plays no part. A store without a clock leaves those
    times ``None`` (:class:`~pubsub_worker.stores.base.Snapshot`); the lease
    is then ``lease_expires_at - now``, which trusts that the writer's clock
    and ours agree. No lease at all: expired.
    """
    if read_time is not None and update_time is not None:
        if record.lease_s is None:
            return 0.0
        return (update_time - read_time).total_seconds() + record.lease_s
    if record.lease_expires_at is None:
        return 0.0
    return (record.lease_expires_at - now).total_seconds()


def lease_fields(lease_s: float, now: datetime) -> dict[str, Any]:
    """What a claim stores of its lease: its length, and its end on the writer's clock."""
    return {s.LEASE_SECONDS: float(lease_s), s.LEASE_EXPIRES_AT: now + timedelta(seconds=lease_s)}


def renewal_due(last_write: float, lease_s: float, now: float | None = None) -> bool:
    """A write would renew the lease now: :data:`RENEW_AFTER` of it passed since ``last_write``.

    Both times are ``time.monotonic()``.
    """
    now = time.monotonic() if now is None else now
    return now - last_write > lease_s * RENEW_AFTER
