"""``jobs list`` across shards, the shard of new documents, and replay by key, on the emulator.

The listing's ``in`` filter over the shards must give exactly what one
unsharded range ordered by ``updated_at`` would: the same rows, in the same
order (ties broken by document id), paged without a row lost or repeated.
The reference here is every document of the collection, read and sorted in
the test; the documents share timestamps on purpose, across shards.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.failure import rejected_document_id
from pubsub_worker._job.keys import derive_identity
from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops.replay import list_failed
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Changes, Status, Version

pytestmark = pytest.mark.emulator

SUB = "projects/test-project/subscriptions/listing"
OTHER_SUB = "projects/test-project/subscriptions/other"
T0 = datetime(2025, 6, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


@pytest.fixture
def store(firestore_client: Any, firestore_collection: str) -> FirestoreJobStore:
    return FirestoreJobStore(firestore_client, firestore_collection)


def new_job(store: FirestoreJobStore, key: str, subscription: str = SUB) -> tuple[str, Version]:
    """A job claimed as a worker claims a new one: the document is created by the claim."""
    identity = derive_identity(
        subscription=subscription,
        message_id=f"m-{key}",
        attributes={"op": key},
        data=b"doc",
        key_attribute="op",
    )
    request = ClaimRequest(
        identity=identity,
        owner="host/1/aa",
        message_id=f"m-{key}",
        delivery=f"d-{key}",
        lease_s=60,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )
    result = claim(store, request)
    assert result.kind is ClaimKind.CLAIMED
    assert result.version is not None
    return identity.doc_id, result.version


def plain_document(store: FirestoreJobStore, doc_id: str) -> None:
    """A completed document written directly, with the fields a listing reads."""
    store.create(
        doc_id,
        {
            s.KEY: doc_id[:8],
            s.SUBSCRIPTION: SUB,
            s.SHARD: s.shard_of(doc_id),
            s.STATUS: Status.COMPLETED.value,
            s.EPOCH: 1,
            s.ATTEMPTS: 1,
            s.UPDATED_AT: T0,
        },
    )


def stored(client: Any, collection: str) -> dict[str, dict[str, Any]]:
    return {snap.id: snap.to_dict() or {} for snap in client.collection(collection).stream()}


def reference(
    client: Any,
    collection: str,
    *,
    status: Status | None = None,
    before: datetime | None = None,
) -> list[str]:
    """What one unsharded range would list: the subscription's documents, newest first."""
    rows = [
        (fields[s.UPDATED_AT], doc_id)
        for doc_id, fields in stored(client, collection).items()
        if fields.get(s.SUBSCRIPTION) == SUB
        and (status is None or fields.get(s.STATUS) == status.value)
        and (before is None or fields[s.UPDATED_AT] < before)
    ]
    return [doc_id for _, doc_id in sorted(rows, reverse=True)]


def every_page(client: Any, collection: str, *, limit: int, **filters: Any) -> list[list[str]]:
    """The pages of a listing, each cursor followed until there is none."""
    pages: list[list[str]] = []
    after = None
    while True:
        page = job_ops.list_jobs(
            client,
            collection,
            SUB,
            limit=limit,
            after=after,
            now=T0 + timedelta(hours=1),
            **filters,
        )
        pages.append([view.doc_id for view in page.jobs])
        if page.next is None:
            return pages
        after = page.next
        assert len(pages) < 100


def test_a_new_job_document_carries_its_shard(
    store: FirestoreJobStore, firestore_client: Any, firestore_collection: str
) -> None:
    doc_id, _ = new_job(store, "first")
    fields = stored(firestore_client, firestore_collection)[doc_id]
    assert fields[s.SHARD] == s.shard_of(doc_id)
    assert isinstance(fields[s.SHARD], int)


def test_the_listing_across_shards_is_one_range_newest_first_paged_without_loss(
    store: FirestoreJobStore, firestore_client: Any, firestore_collection: str
) -> None:
    ids = []
    for i in range(40):
        doc_id, version = new_job(store, f"order-{i}")
        # Three documents per timestamp (ties across shards), every fourth one completed.
        changes: Changes = {(s.UPDATED_AT,): T0 + timedelta(seconds=i // 3)}
        if i % 4 == 0:
            changes = {**changes, (s.STATUS,): Status.COMPLETED.value}
        store.update(doc_id, changes, expected=version)
        ids.append(doc_id)
    new_job(store, "elsewhere", subscription=OTHER_SUB)  # another subscription: never listed
    assert len({s.shard_of(doc_id) for doc_id in ids}) >= 10

    everything = reference(firestore_client, firestore_collection)
    assert sorted(everything) == sorted(ids)
    pages = every_page(firestore_client, firestore_collection, limit=7)
    assert [len(page) for page in pages] == [7, 7, 7, 7, 7, 5]
    assert [doc_id for page in pages for doc_id in page] == everything

    completed = reference(firestore_client, firestore_collection, status=Status.COMPLETED)
    assert len(completed) == 10
    pages = every_page(firestore_client, firestore_collection, limit=4, status=Status.COMPLETED)
    assert [doc_id for page in pages for doc_id in page] == completed

    # Not written for 3,590 s at T0 + 1 h: written before T0 + 10 s, the first 30 jobs.
    older = reference(firestore_client, firestore_collection, before=T0 + timedelta(seconds=10))
    assert len(older) == 30
    pages = every_page(firestore_client, firestore_collection, limit=8, older_than_s=3590)
    assert [doc_id for page in pages for doc_id in page] == older


def test_replay_by_key_reads_the_documents_of_the_keys_without_a_query(
    store: FirestoreJobStore, firestore_client: Any, firestore_collection: str
) -> None:
    job_a, _ = new_job(store, "a")
    rejected = rejected_document_id(SUB, "m-7")  # a message rejected before it became a job
    plain_document(store, rejected)
    new_job(store, "b")  # not asked for

    found = list_failed(
        firestore_client, firestore_collection, SUB, keys=["a", "m-7", "never-seen", "a"]
    )

    assert [failed.doc_id for failed in found] == [job_a, rejected]
