"""The batching store with step results near their limit, many jobs in flight: no request too big.

Production refuses a request over 10 MiB with ``INVALID_ARGUMENT``, and with
it every write it carries. The emulator refuses one over 4 MiB, but as
``RESOURCE_EXHAUSTED``, which the store takes for an unknown outcome and
retries, so an over-size batch can still end in every write landing there.
The fixture here refuses, at the store's send seam, what production would
refuse, the way production does, and counts every request and write sent.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.cloud.firestore_v1.types import firestore as firestore_types

from pubsub_worker._job.records import MAX_RESULT_BYTES, encode
from pubsub_worker._support.limits import MAX_BATCH_WRITE_BYTES
from pubsub_worker.stores.base import STEPS, Version
from pubsub_worker.stores.batching import BatchingFirestoreJobStore

pytestmark = pytest.mark.emulator

PRODUCTION_REQUEST_BYTES = 10 * 1024 * 1024
"""Firestore's limit on one API request (10 MiB)."""
JOBS = 60
_REQUEST = firestore_types.BatchWriteRequest.pb()


class _PayloadTooLarge(grpc.RpcError):
    """What production answers a request over its size limit: nothing in it is applied."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return f"Request payload size exceeds the limit: {PRODUCTION_REQUEST_BYTES} bytes."

    def trailing_metadata(self) -> tuple[Any, ...]:
        return ()


@dataclass
class Requests:
    """The ``BatchWrite`` requests the store sent: each one's serialized bytes and writes."""

    sizes: list[int] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)
    refused: int = 0
    hold: threading.Event = field(default_factory=threading.Event)
    """Set: each request waits (outside any lock) until ``released`` is set."""
    released: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def store(firestore_client: Any, firestore_collection: str) -> Iterator[BatchingFirestoreJobStore]:
    """The default batching store."""
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    yield store
    store.close()


@pytest.fixture
def requests(store: BatchingFirestoreJobStore, monkeypatch: pytest.MonkeyPatch) -> Requests:
    """Production's request limit, enforced on every request the store sends; and its record."""
    seen = Requests()
    call = store.batcher._call

    def checked(request: bytes, **kwargs: Any) -> Any:
        size = len(request)
        seen.sizes.append(size)
        seen.writes.append(len(_REQUEST.FromString(request).writes))
        if seen.hold.is_set():
            assert seen.released.wait(30), "the held requests were never released"
        if size > PRODUCTION_REQUEST_BYTES:
            seen.refused += 1
            raise _PayloadTooLarge()
        return call(request, **kwargs)

    monkeypatch.setattr(store.batcher, "_call", checked)
    return seen


def test_sixty_jobs_recording_results_near_the_limit_all_commit_in_requests_under_the_cap(
    store: BatchingFirestoreJobStore, requests: Requests
) -> None:
    """60 jobs each commit a ~250 KiB step result at once (15 MB in all): every write lands.

    The requests in flight are held until all 60 writes are queued behind
    them, as when Firestore is slow to answer: the queue a slow answer leaves
    behind, made certain.
    """
    result = encode("charge", "r" * (MAX_RESULT_BYTES - 6 * 1024))
    versions: dict[str, Version] = {}
    for i in range(JOBS):
        versions[f"job-{i}"] = store.create(f"job-{i}", {"epoch": 1, "state": "running"})
    assert requests.refused == 0
    batcher = store.batcher
    sent_before = batcher.writes
    requests.sizes.clear()
    requests.writes.clear()

    barrier = threading.Barrier(JOBS)
    outcomes: dict[str, Version | BaseException] = {}

    def commit(job: str) -> None:
        record = {"result": result, "epoch": 1, "at": datetime.datetime.now(datetime.timezone.utc)}
        changes = {(STEPS, "charge"): record, ("state",): "done"}
        barrier.wait()
        try:
            outcomes[job] = store.update(job, changes, expected=versions[job])
        except BaseException as exc:
            outcomes[job] = exc

    requests.hold.set()
    threads = [threading.Thread(target=commit, args=(job,)) for job in versions]
    for thread in threads:
        thread.start()
    try:
        _wait_until_all_queued_or_sent(lambda: batcher.writes - sent_before + len(batcher._queue))
    finally:
        requests.released.set()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()

    failed = {job: o for job, o in outcomes.items() if isinstance(o, BaseException)}
    assert failed == {}
    assert len(outcomes) == JOBS
    assert requests.refused == 0
    assert max(requests.sizes) <= MAX_BATCH_WRITE_BYTES
    assert sum(requests.writes) == JOBS  # each write sent once: none refused, none retried
    assert len(requests.sizes) > 2  # more than the two requests held in flight
    for job, version in outcomes.items():
        snap = store.get(job)
        assert snap is not None
        assert snap.version == version
        assert snap.fields["state"] == "done"
        assert snap.fields[STEPS]["charge"]["result"] == result


def _wait_until_all_queued_or_sent(count: Callable[[], int]) -> None:
    """Until ``count()`` (the commits queued or sent) reaches the number of jobs."""
    deadline = time.monotonic() + 30
    while count() < JOBS:
        assert time.monotonic() < deadline, f"only {count()} of {JOBS} writes queued"
        time.sleep(0.01)
