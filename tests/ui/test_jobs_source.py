"""The dashboard's reads on the real Firestore emulator: counts, pages, filters, one job.

Hundreds of job documents in the stored layout (:mod:`benchmarks.ui_support`),
for the dashboard's subscription and for another one in the same collection;
every number and every page is checked against what was written.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import pubsub_worker
from benchmarks.ui_support import Job, bulk_job, job_document, write_documents
from pubsub_worker._ops.jobs_view import JobView
from pubsub_worker.stores.base import Status
from pubsub_worker.ui import jobs as ui_jobs
from pubsub_worker.ui.filters import Filters
from pubsub_worker.ui.jobs import Jobs

pytestmark = pytest.mark.emulator

PROJECT = "pubsub-worker-test"
SUB = f"projects/{PROJECT}/subscriptions/ui-orders"
OTHER = f"projects/{PROJECT}/subscriptions/ui-refunds"
COUNT = 700


@pytest.fixture
def world(emulators: Any, firestore_client: Any, firestore_collection: str) -> Any:
    now = datetime.now(timezone.utc)
    rng = random.Random(11)
    jobs = [bulk_job(i, now, rng) for i in range(COUNT)]
    # One running job whose owner stopped writing ten minutes ago: stuck, and the oldest.
    stuck = Job("op-stuck", Status.RUNNING, now - timedelta(minutes=10), [("parse", 80)])
    jobs.append(stuck)
    documents = [job_document(SUB, job) for job in jobs]
    # Another subscription's jobs in the same collection: never counted or listed here.
    documents += [job_document(OTHER, bulk_job(i, now, rng)) for i in range(60)]
    write_documents(firestore_client, firestore_collection, documents)
    settings = pubsub_worker.Settings(
        subscription=SUB, collection=firestore_collection, lease_seconds=60
    )
    source = Jobs(settings, client=firestore_client)
    yield source, jobs, {job.key: doc_id for job, (doc_id, _) in zip(jobs, documents, strict=False)}
    source.close()


def _keys(rows: list[JobView]) -> list[str]:
    return [view.key or "" for view in rows]


def _walk(source: Jobs, filters: Filters) -> tuple[list[JobView], int]:
    """Every row of every page, following the cursors; and how many pages."""
    sub = source.subscription(None)
    rows: list[JobView] = []
    pages = 0
    while True:
        page = source.page(sub, filters)
        pages += 1
        rows += page.jobs
        if page.next is None:
            return rows, pages
        filters = Filters(**{**filters.__dict__, "after": page.next})


def test_counts_are_exact_per_status_stuck_reason_and_the_oldest_running(world: Any) -> None:
    source, jobs, _ = world
    sub = source.subscription(None)
    counts = source.counts(sub)
    assert counts.by_status == {st: sum(1 for j in jobs if j.status is st) for st in Status}
    assert counts.total == len(jobs)
    assert counts.stuck == 1
    assert counts.oldest_running is not None
    assert counts.oldest_running.key == "op-stuck"
    assert counts.missing == ()
    review = source.review(sub)
    failed = Counter(j.reason for j in jobs if j.status is Status.FAILED)
    assert review.reasons.total == counts.by_status[Status.FAILED]
    assert dict(review.reasons.by_reason) == dict(failed)
    assert list(review.reasons.by_reason) == [r for r, _ in failed.most_common()]
    assert review.reasons.other == 0
    newest = sorted((j for j in jobs if j.status is Status.FAILED), key=lambda j: j.updated_at)
    sampled = [v.key for views in review.samples.values() for v in views]
    assert sorted(sampled) == sorted(j.key for j in newest[-ui_jobs.SAMPLED :])
    for reason, views in review.samples.items():
        assert {v.reason for v in views} == {reason}


def test_the_pages_hold_every_job_once_newest_first(world: Any) -> None:
    source, jobs, _ = world
    rows, pages = _walk(source, Filters())
    assert pages == -(-len(jobs) // ui_jobs.PAGE)
    assert sorted(_keys(rows)) == sorted(j.key for j in jobs)
    stamps = [view.updated_at for view in rows]
    assert stamps == sorted(stamps, reverse=True)  # type: ignore[type-var]


def test_status_reason_and_time_range_filters_keep_exactly_their_jobs(world: Any) -> None:
    source, jobs, _ = world
    rows, _ = _walk(source, Filters(status=Status.RELEASED))
    assert sorted(_keys(rows)) == sorted(j.key for j in jobs if j.status is Status.RELEASED)
    rows, _ = _walk(source, Filters(status=Status.FAILED, reason="too_large"))
    assert sorted(_keys(rows)) == sorted(j.key for j in jobs if j.reason == "too_large")
    now = datetime.now(timezone.utc)
    since, until = now - timedelta(days=5), now - timedelta(days=2)
    rows, _ = _walk(source, Filters(since=since, until=until))
    expected = [j.key for j in jobs if since <= j.updated_at < until]
    assert expected
    assert sorted(_keys(rows)) == sorted(expected)


def test_a_key_prefix_reads_at_most_its_budget_per_page_and_misses_nothing(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, jobs, ids = world
    monkeypatch.setattr(ui_jobs, "SCAN_BUDGET", 100)
    monkeypatch.setattr(ui_jobs, "_SCAN_BATCH", 40)
    sub = source.subscription(None)
    page = source.page(sub, Filters(prefix="op-00001"))
    assert page.scanned <= 100 + 40  # the budget is checked between batches
    assert page.next is not None
    rows, pages = _walk(source, Filters(prefix="op-00001"))
    assert sorted(_keys(rows)) == sorted(j.key for j in jobs if j.key.startswith("op-00001"))
    assert pages >= len(jobs) // (100 + 40)  # each page read a bounded slice
    exact = source.page(sub, Filters(prefix="op-0000123")).exact
    assert exact is not None
    assert exact.doc_id == ids["op-0000123"]


def test_one_job_s_story_and_what_may_be_done_with_it(world: Any) -> None:
    source, jobs, ids = world
    failed = next(j for j in jobs if j.status is Status.FAILED)
    detail = source.detail(ids[failed.key])
    assert detail is not None
    assert (detail.view.key, detail.view.reason, detail.view.attempts) == (
        failed.key,
        failed.reason,
        failed.attempts,
    )
    assert detail.record.attributes == {"operation_id": failed.key}
    assert detail.payload_bytes == len(b"{}")
    assert detail.replay_refusal is None
    assert detail.release_refusal == "failed: only a running job is released"
    running = source.detail(ids["op-stuck"])
    assert running is not None
    assert running.release_refusal is None
    # Its lease is judged on Firestore's clock, like a claim judges it: its document was
    # written moments ago, so a replay would leave it to its owner.
    assert running.replay_refusal == "running"
    assert source.detail("0" * 64) is None
