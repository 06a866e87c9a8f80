"""Claim decisions (pure) and the claim procedure on the in-memory store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pubsub_worker.claim import ClaimKind, ClaimRequest, claim, decide
from pubsub_worker.keys import derive_identity
from pubsub_worker.store import JobRecord, Status
from pubsub_worker.stores import MemoryJobStore

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SUB = "projects/p/subscriptions/s"


def request(
    *,
    owner: str = "me",
    message_id: str = "m1",
    delivery: str = "d1",
    data: bytes = b"payload",
    superseded: bool = False,
) -> ClaimRequest:
    identity = derive_identity(
        subscription=SUB,
        message_id=message_id,
        attributes={"op": "k"},
        data=data,
        key_attribute="op",
    )
    return ClaimRequest(
        identity=identity,
        owner=owner,
        message_id=message_id,
        delivery=delivery,
        lease_s=10,
        retention_s=3600,
        superseded=lambda _m, _d: superseded,
    )


def record(status: Status, *, lease_s: float = 5, **overrides: object) -> JobRecord:
    base: dict[str, object] = {
        "status": status,
        "epoch": 3,
        "owner": "other",
        "message_id": "m1",
        "delivery": "d0",
        "lease_expires_at": NOW + timedelta(seconds=lease_s),
        "attempts": 2,
        "payload_sha256": request().identity.payload_sha256,
    }
    base.update(overrides)
    return JobRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (record(Status.COMPLETED), ClaimKind.COMPLETED),
        (record(Status.FAILED), ClaimKind.FAILED),
        (record(Status.RUNNING), ClaimKind.BUSY),
        (record(Status.RUNNING, lease_s=-1), ClaimKind.CLAIMED),
        (record(Status.RELEASED), ClaimKind.CLAIMED),
        (record(Status.COMPLETED, payload_sha256="f" * 64), ClaimKind.CONFLICT),
    ],
)
def test_decide(stored: JobRecord, expected: ClaimKind) -> None:
    assert decide(stored, request(), NOW) is expected


def test_a_superseded_delivery_of_this_process_is_taken_over_despite_its_lease() -> None:
    mine = record(Status.RUNNING, owner="me", delivery="d0")
    assert decide(mine, request(superseded=True), NOW) is ClaimKind.CLAIMED
    # the same owner with a different message id (same key) must wait its turn
    other_message = record(Status.RUNNING, owner="me", message_id="m0", delivery="d0")
    assert decide(other_message, request(superseded=True), NOW) is ClaimKind.BUSY
    # another process's live lease is never taken over early
    theirs = record(Status.RUNNING, owner="other", delivery="d0")
    assert decide(theirs, request(superseded=True), NOW) is ClaimKind.BUSY


def test_claim_creates_then_takes_over_with_a_higher_epoch() -> None:
    store = MemoryJobStore()
    first = claim(store, request())
    assert first.kind is ClaimKind.CLAIMED
    assert (first.epoch, first.record.attempts if first.record else 0) == (1, 1)
    busy = claim(store, request(owner="other", delivery="d2"))
    assert busy.kind is ClaimKind.BUSY
    assert busy.busy_until is not None
    # expire the lease, then the other owner takes over at epoch 2
    snap = store.get(request().identity.doc_id)
    assert snap is not None
    store.update(
        request().identity.doc_id,
        {("lease_expires_at",): datetime.now(timezone.utc) - timedelta(seconds=1)},
        expected=snap.version,
    )
    taken = claim(store, request(owner="other", delivery="d2"))
    assert taken.kind is ClaimKind.CLAIMED
    assert taken.epoch == 2
    assert taken.record is not None
    assert taken.record.attempts == 2
    assert taken.record.owner == "other"


def test_claim_reports_a_conflicting_payload_for_the_same_key() -> None:
    store = MemoryJobStore()
    assert claim(store, request()).kind is ClaimKind.CLAIMED
    other = claim(store, request(message_id="m2", delivery="d9", data=b"different"))
    assert other.kind is ClaimKind.CONFLICT
