"""Claim decisions (pure) and the claim procedure on the in-memory store."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from pubsub_worker._job import claim as claim_module
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim, decide
from pubsub_worker._job.keys import derive_identity
from pubsub_worker._job.lease import lease_left_s
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores.base import EXPIRE_AT, LEASE_SECONDS, JobRecord, Status

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SUB = "projects/p/subscriptions/s"
LEASE_S = 10.0


class Clock:
    """A clock the test moves by hand: the store's (server) clock."""

    def __init__(self, start: datetime = NOW) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def request(
    *,
    owner: str = "me",
    message_id: str = "m1",
    delivery: str = "d1",
    data: bytes = b"payload",
    abandoned: tuple[str, str] | None = None,
    retention_s: float = 3600,
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
        lease_s=LEASE_S,
        retention_s=retention_s,
        abandoned=lambda m, d: (m, d) == abandoned,
    )


def record(status: Status, *, expires_in_s: float = 5, **overrides: object) -> JobRecord:
    base: dict[str, object] = {
        "status": status,
        "epoch": 3,
        "owner": "other",
        "message_id": "m1",
        "delivery": "d0",
        "lease_expires_at": NOW + timedelta(seconds=expires_in_s),
        "attempts": 2,
        "payload_sha256": request().identity.payload_sha256,
    }
    base.update(overrides)
    return JobRecord(**base)  # type: ignore[arg-type]


def skew_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This worker's wall clock runs ``seconds`` off the real time (the store's clock is not)."""
    monkeypatch.setattr(
        claim_module, "now_utc", lambda: datetime.now(timezone.utc) + timedelta(seconds=seconds)
    )


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (record(Status.COMPLETED), ClaimKind.COMPLETED),
        (record(Status.FAILED), ClaimKind.FAILED),
        (record(Status.RUNNING), ClaimKind.BUSY),
        (record(Status.RUNNING, expires_in_s=-1), ClaimKind.CLAIMED),
        (record(Status.RUNNING, lease_expires_at=None), ClaimKind.CLAIMED),
        (record(Status.RELEASED), ClaimKind.CLAIMED),
        (record(Status.COMPLETED, payload_sha256="f" * 64), ClaimKind.CONFLICT),
    ],
)
def test_decide_without_server_times_uses_lease_expires_at(
    stored: JobRecord, expected: ClaimKind
) -> None:
    assert decide(stored, request(), NOW) is expected


@pytest.mark.parametrize(
    ("written_s_ago", "expected"),
    [(0, ClaimKind.BUSY), (9.9, ClaimKind.BUSY), (10, ClaimKind.CLAIMED), (30, ClaimKind.CLAIMED)],
)
@pytest.mark.parametrize("skew_s", [-3600, -60, 0, 60, 3600])
@pytest.mark.parametrize("written_expiry_s", [-3600, 3600])
def test_decide_with_server_times_ignores_the_wall_clocks(
    written_s_ago: float, expected: ClaimKind, skew_s: float, written_expiry_s: float
) -> None:
    # Neither our clock (now) nor the previous owner's (its lease_expires_at) plays a part.
    stored = record(Status.RUNNING, expires_in_s=written_expiry_s, lease_s=LEASE_S)
    now = NOW + timedelta(seconds=skew_s)
    update_time = NOW - timedelta(seconds=written_s_ago)
    assert decide(stored, request(), now, read_time=NOW, update_time=update_time) is expected
    left_s = lease_left_s(stored, now, read_time=NOW, update_time=update_time)
    assert left_s == pytest.approx(LEASE_S - written_s_ago)


def test_with_server_times_lease_expires_at_is_never_read() -> None:
    # The wall-clock lease is for stores without a clock only: with server times and no
    # lease_seconds there is no lease, whatever lease_expires_at says.
    stored = record(Status.RUNNING, expires_in_s=3600)
    assert stored.lease_s is None
    assert lease_left_s(stored, NOW, read_time=NOW, update_time=NOW) == 0.0
    assert decide(stored, request(), NOW, read_time=NOW, update_time=NOW) is ClaimKind.CLAIMED


def test_an_abandoned_delivery_of_this_process_is_taken_over_despite_its_lease() -> None:
    # The holder is this process's delivery d0 of message m1, past its processing cap.
    mine = record(Status.RUNNING, owner="me", delivery="d0")
    assert decide(mine, request(abandoned=("m1", "d0")), NOW) is ClaimKind.CLAIMED
    # ... of another message with the same key: the same (the gate passed it over too)
    other_message = record(Status.RUNNING, owner="me", message_id="m0", delivery="d0")
    assert decide(other_message, request(abandoned=("m0", "d0")), NOW) is ClaimKind.CLAIMED
    # a delivery of this process that is still within its cap is waited for: it adopts
    assert decide(mine, request(abandoned=None), NOW) is ClaimKind.BUSY
    # another process's live lease is never taken over early
    theirs = record(Status.RUNNING, owner="other", delivery="d0")
    assert decide(theirs, request(abandoned=("m1", "d0")), NOW) is ClaimKind.BUSY


def test_claim_creates_then_takes_over_with_a_higher_epoch_once_the_lease_ran_out() -> None:
    server = Clock()
    store = MemoryJobStore(clock=server)
    first = claim(store, request())
    assert first.kind is ClaimKind.CLAIMED
    assert first.record is not None
    assert (first.epoch, first.record.attempts, first.record.lease_s) == (1, 1, LEASE_S)
    server.advance(4)
    busy = claim(store, request(owner="other", delivery="d2"))
    assert busy.kind is ClaimKind.BUSY
    assert busy.busy_for_s == pytest.approx(LEASE_S - 4)
    server.advance(LEASE_S - 4)
    taken = claim(store, request(owner="other", delivery="d2"))
    assert taken.kind is ClaimKind.CLAIMED
    assert taken.epoch == 2
    assert taken.record is not None
    assert taken.record.attempts == 2
    assert taken.record.owner == "other"
    assert taken.record.lease_s == LEASE_S
    snap = store.get(request().identity.doc_id)
    assert snap is not None
    assert snap.fields[LEASE_SECONDS] == LEASE_S


@pytest.mark.parametrize("skew_s", [-60, 60])
def test_a_skewed_wall_clock_neither_takes_over_early_nor_waits_too_long(
    monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    server = Clock(datetime.now(timezone.utc))
    store = MemoryJobStore(clock=server)
    assert claim(store, request()).kind is ClaimKind.CLAIMED  # the owner's clock is right

    skew_wall_clock(monkeypatch, skew_s)  # from here on, the other worker's clock is off
    server.advance(LEASE_S - 1)
    early = claim(store, request(owner="other", delivery="d2"))
    assert early.kind is ClaimKind.BUSY
    assert early.busy_for_s == pytest.approx(1)

    server.advance(1)
    on_time = claim(store, request(owner="other", delivery="d2"))
    assert on_time.kind is ClaimKind.CLAIMED
    assert on_time.epoch == 2


def test_every_write_of_the_owner_renews_the_lease() -> None:
    server = Clock()
    store = MemoryJobStore(clock=server)
    mine = claim(store, request())
    doc_id = request().identity.doc_id
    server.advance(LEASE_S - 1)
    store.update(doc_id, {("steps", "a"): {"result": "1", "epoch": 1}}, expected=mine.version)
    server.advance(LEASE_S - 1)  # 2 * LEASE_S - 2 after the claim, LEASE_S - 1 after the step
    busy = claim(store, request(owner="other", delivery="d2"))
    assert busy.kind is ClaimKind.BUSY
    assert busy.busy_for_s == pytest.approx(1)


def test_a_take_over_refreshes_the_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Clock()
    store = MemoryJobStore(clock=server)
    doc_id = request().identity.doc_id
    wall = Clock()
    monkeypatch.setattr(claim_module, "now_utc", wall)
    claim(store, request(retention_s=100))
    snap = store.get(doc_id)
    assert snap is not None
    assert snap.fields[EXPIRE_AT] == NOW + timedelta(seconds=100)

    server.advance(LEASE_S)
    wall.advance(3600)
    taken = claim(store, request(owner="other", delivery="d2", retention_s=100))
    assert taken.kind is ClaimKind.CLAIMED
    snap = store.get(doc_id)
    assert snap is not None
    assert snap.fields[EXPIRE_AT] == NOW + timedelta(seconds=3600 + 100)


def test_claim_reports_a_conflicting_payload_for_the_same_key() -> None:
    store = MemoryJobStore()
    assert claim(store, request()).kind is ClaimKind.CLAIMED
    other = claim(store, request(message_id="m2", delivery="d9", data=b"different"))
    assert other.kind is ClaimKind.CONFLICT


TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("trace_parent", [None, TRACE_PARENT])
def test_a_new_job_s_claim_returns_the_record_as_stored(trace_parent: str | None) -> None:
    """A new job's record is built without parsing what was written: it must equal the parse."""
    store = MemoryJobStore()
    req = dataclasses.replace(request(), trace_parent=trace_parent)
    got = claim(store, req)
    snap = store.get(req.identity.doc_id)
    assert got.kind is ClaimKind.CLAIMED
    assert snap is not None
    assert got.record == JobRecord.parse(snap.fields)
