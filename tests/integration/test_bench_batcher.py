"""``python -m benchmarks.batcher``: its figures per job, on the emulator."""

from __future__ import annotations

from typing import Any

from benchmarks.batcher import measure
from pubsub_worker.stores.batching import BatchingFirestoreJobStore


def test_concurrent_writers_figures_count_every_job_s_two_writes_and_the_roles(
    firestore_client: Any, firestore_collection: str
) -> None:
    store = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    try:
        writes = store.batcher.writes
        load = measure(store, threads=3, seconds=0.5)
        assert load.jobs > 0
        assert store.batcher.writes - writes == 2 * load.jobs  # a create and an update each
        assert 0 < load.rpcs <= 2  # no more RPCs than writes, shared when they met
        assert load.cpu_ms > 0
        assert load.jobs_per_s > 0
        assert load.switches.get("callbacks", 0) > 0  # the writing threads waited on answers
    finally:
        store.close()
