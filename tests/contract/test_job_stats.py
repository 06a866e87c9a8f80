"""``jobs stats`` (:func:`pubsub_worker._ops.stats.job_stats`): the same answers on every index.

The in-memory store (read whole) and Firestore on the real emulator (aggregation
counts on the listing index, the oldest running job read or found by counting) are
given the same documents and must agree, exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pubsub_worker._ops import stats as ops_stats
from pubsub_worker._ops.job_counts import reason_counts
from pubsub_worker._ops.stats import job_stats
from pubsub_worker.stores import FirestoreJobStore, MemoryJobStore
from pubsub_worker.stores.base import JobStore, Review, Status
from pubsub_worker.stores.job_index import FirestoreJobIndex, JobIndex, MemoryJobIndex
from tests.support.job_documents import put_job

SUB = "projects/proj/subscriptions/orders"
OTHER = "projects/proj/subscriptions/refunds"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


class Counted:
    """An index that counts the count queries it answers."""

    def __init__(self, index: JobIndex) -> None:
        self.index = index
        self.subscription = index.subscription
        self.counts = 0

    def count(
        self, status: Status, *, before: datetime | None = None, reason: str | None = None
    ) -> int:
        self.counts += 1
        return self.index.count(status, before=before, reason=reason)

    def newest(self, status: Status, **options: Any) -> list[ops_stats.Row]:
        return self.index.newest(status, **options)


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def world(request: pytest.FixtureRequest) -> Iterator[tuple[JobStore, Any]]:
    """A store to write the documents to, and ``index(subscription)`` reading it."""
    if request.param == "memory":
        memory = MemoryJobStore()
        yield memory, lambda sub: MemoryJobIndex(memory, sub)
        return
    client = request.getfixturevalue("firestore_client")
    collection = request.getfixturevalue("firestore_collection")
    yield (
        FirestoreJobStore(client, collection),
        lambda sub: FirestoreJobIndex(client, collection, sub),
    )


@pytest.mark.parametrize("search", [False, True], ids=["read", "search"])
def test_counts_by_status_the_stuck_the_oldest_running_job_and_the_pending_reviews(
    world: tuple[JobStore, Any], search: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oldest running job read newest first (few running) or found by counting (many)."""
    if search:
        monkeypatch.setattr(ops_stats, "OLDEST_READS", 2)  # 3 running jobs: more than read
    store, index = world
    # Running: the oldest and the next differ by one microsecond, both hours back, at times
    # off any grid the search could step on by luck.
    oldest = ago(hours=3, microseconds=123_457)
    put_job(store, SUB, "run-oldest", Status.RUNNING, updated_at=oldest)
    put_job(store, SUB, "run-next", Status.RUNNING, updated_at=oldest + timedelta(microseconds=1))
    put_job(store, SUB, "run-new", Status.RUNNING, updated_at=ago(seconds=5, microseconds=7))
    put_job(store, SUB, "released", Status.RELEASED, updated_at=ago(minutes=1))
    for i in range(5):
        put_job(store, SUB, f"done-{i}", Status.COMPLETED, updated_at=ago(minutes=i))
    pending, sent = Review.PENDING.value, Review.SENT.value
    put_job(store, SUB, "failed-pending", Status.FAILED, review=pending, updated_at=ago(seconds=30))
    put_job(store, SUB, "failed-sent", Status.FAILED, review=sent, updated_at=ago(seconds=20))
    put_job(store, SUB, "failed-no-topic", Status.FAILED, updated_at=ago(days=2))
    # Not counted: another subscription's jobs.
    put_job(store, OTHER, "elsewhere", Status.RUNNING, updated_at=ago(days=30))

    counted = Counted(index(SUB))
    with ThreadPoolExecutor(max_workers=4) as pool:
        stats = job_stats(counted, stuck_after_s=60, now=NOW, executor=pool)

    assert stats.counts == {
        Status.RUNNING: 3,
        Status.RELEASED: 1,
        Status.COMPLETED: 5,
        Status.FAILED: 3,
    }
    assert stats.total == 12
    assert stats.oldest_running is not None
    assert (stats.oldest_running.key, stats.oldest_running.updated_at) == ("run-oldest", oldest)
    assert stats.oldest_running.owner == "host/4242/cafe"
    assert (stats.reviews_pending, stats.reviews_read) == (1, 3)
    assert (stats.stuck, stats.stuck_after_s) == (2, 60)  # the two written hours ago
    if search:  # by status, the stuck, then the search
        assert 5 < counted.counts <= 5 + ops_stats.MAX_COUNTS
    else:  # by status and the stuck: the oldest read, not counted
        assert counted.counts == 5
    document = stats.to_json()
    assert document["counts"] == {"running": 3, "released": 1, "completed": 5, "failed": 3}
    assert document["oldest_running"]["key"] == "run-oldest"
    assert (document["total"], document["reviews_pending"], document["reviews_read"]) == (12, 1, 3)
    assert document["stuck"] == 2

    # At most review_reads failed jobs are read, the most recently written first.
    capped = job_stats(index(SUB), review_reads=2, now=NOW)
    assert (capped.reviews_pending, capped.reviews_read) == (1, 2)


def test_one_running_job_is_the_oldest_and_no_job_counts_nothing(
    world: tuple[JobStore, Any],
) -> None:
    store, index = world
    empty = job_stats(index(SUB), now=NOW)
    assert (empty.counts, empty.total, empty.oldest_running) == (dict.fromkeys(Status, 0), 0, None)
    assert (empty.reviews_pending, empty.reviews_read) == (0, 0)

    put_job(store, SUB, "alone", Status.RUNNING, updated_at=NOW - timedelta(minutes=7))
    alone = job_stats(index(SUB), now=NOW)
    assert alone.oldest_running is not None
    assert alone.oldest_running.key == "alone"
    assert alone.counts[Status.RUNNING] == alone.total == 1
    assert alone.stuck is None  # not asked for


def test_failed_jobs_are_counted_per_reason_with_the_rest_apart(
    world: tuple[JobStore, Any],
) -> None:
    store, index = world
    reasons = ["attempts", "attempts", "permanent", "too_large", "attempts"]
    for i, reason in enumerate(reasons):
        put_job(store, SUB, f"f-{i}", Status.FAILED, reason=reason, updated_at=ago(minutes=i))
    put_job(store, SUB, "by-hand", Status.FAILED, reason="typed in the console")
    put_job(store, OTHER, "elsewhere", Status.FAILED, reason="attempts")
    put_job(store, SUB, "released", Status.RELEASED, reason="attempts")  # failed once, then not

    counts = reason_counts(index(SUB))

    assert counts.total == 6
    assert dict(counts.by_reason) == {"attempts": 3, "permanent": 1, "too_large": 1}
    assert next(iter(counts.by_reason)) == "attempts"  # most first
    assert counts.other == 1
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert reason_counts(index(SUB), pool) == counts
