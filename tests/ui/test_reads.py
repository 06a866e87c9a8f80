"""No page of the dashboard reads more than its page: counted on every Firestore call it makes.

1,200 jobs are seeded; every document the Firestore client hands back (from a
query, a batched read or a read by id) and every aggregation is counted while
each page is asked for. A page that scanned the collection would read all of
them; each reads at most what it shows (and a key prefix its budget), and
its numbers come from ``count()`` aggregations, which read no document.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from google.cloud.firestore_v1 import aggregation, client, document, query

import pubsub_worker
from benchmarks.ui_support import bulk_job, job_document, write_documents
from pubsub_worker._ops import stats
from pubsub_worker.stores import job_index
from pubsub_worker.ui import Jobs, create_app
from pubsub_worker.ui import jobs as ui_jobs

pytestmark = pytest.mark.emulator

SUB = "projects/pubsub-worker-test/subscriptions/ui-reads"
COUNT = 1200


class Reads:
    """Documents and aggregations the Firestore client returned, in any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.documents = 0
        self.aggregations = 0

    def add(self, documents: int = 0, aggregations: int = 0) -> None:
        with self.lock:
            self.documents += documents
            self.aggregations += aggregations


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    counted = Reads()
    stream, get_all = query.Query.stream, client.Client.get_all
    get, aggregate = document.DocumentReference.get, aggregation.AggregationQuery.get

    def counting_stream(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for snapshot in stream(self, *args, **kwargs):
            counted.add(documents=1)
            yield snapshot

    def counting_get_all(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for snapshot in get_all(self, *args, **kwargs):
            counted.add(documents=1)
            yield snapshot

    def counting_get(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted.add(documents=1)
        return get(self, *args, **kwargs)

    def counting_aggregate(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted.add(aggregations=1)
        return aggregate(self, *args, **kwargs)

    monkeypatch.setattr(query.Query, "stream", counting_stream)
    monkeypatch.setattr(client.Client, "get_all", counting_get_all)
    monkeypatch.setattr(document.DocumentReference, "get", counting_get)
    monkeypatch.setattr(aggregation.AggregationQuery, "get", counting_aggregate)
    return counted


def test_every_page_reads_at_most_its_page(
    emulators: Any,
    firestore_client: Any,
    firestore_collection: str,
    serve: Callable[[Any], AbstractContextManager[str]],
    reads: Reads,
) -> None:
    now = datetime.now(timezone.utc)
    rng = random.Random(5)
    documents = [job_document(SUB, bulk_job(i, now, rng)) for i in range(COUNT)]
    write_documents(firestore_client, firestore_collection, documents)
    failed = next(doc_id for doc_id, fields in documents if fields["status"] == "failed")
    settings = pubsub_worker.Settings(subscription=SUB, collection=firestore_collection)
    jobs = Jobs(settings, client=firestore_client)
    sub = quote(SUB, safe="")
    pages = {
        # path: (documents at most, aggregations)
        "/": (ui_jobs.RECENT + 1 + 20 + 1, 0),  # each list one more than shown; counts follow
        # `jobs stats`: 4 statuses and the stuck counted; the running jobs' updated_at read
        # (at most OLDEST_READS + 1) and the oldest in full; the newest failed jobs' review.
        f"/parts/counts?sub={sub}": (stats.OLDEST_READS + 1 + 1 + job_index.REVIEW_READS, 5),
        "/jobs": (ui_jobs.PAGE + 1, 0),
        f"/jobs?sub={sub}&status=failed&reason=attempts": (ui_jobs.PAGE + 1, 0),
        f"/jobs/{failed}": (1, 0),
        "/review": (ui_jobs.SAMPLED + 1, 8),
        # The prefix's budget (each of its two queries reads one more, to know whether a
        # next page exists), and the exact key by id (as a job and as a rejected message).
        "/jobs?prefix=no-such-key": (ui_jobs.SCAN_BUDGET + 2 + 2, 0),
    }
    try:
        with serve(create_app(jobs)) as url, httpx.Client(base_url=url, timeout=120) as http:
            for path, (most, aggregations) in pages.items():
                reads.documents = reads.aggregations = 0
                assert http.get(path).status_code == 200, path
                assert 0 < reads.documents <= most < COUNT, (path, reads.documents)
                assert reads.aggregations == aggregations, (path, reads.aggregations)
    finally:
        jobs.close()
