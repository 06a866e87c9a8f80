"""Replay rules on the in-memory store: what is replayed, what is skipped, and the fencing.

The store's clock is a hand-moved clock (the server's), so leases and the
"replayed moments ago" window are judged as on Firestore, and a skewed wall
clock in the replaying process changes nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import REPLAY_OF_ATTRIBUTE, derive_identity
from pubsub_worker._ops import replay as replay_module
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, ReplayResult, replay
from pubsub_worker.errors import StoreError, VersionConflict
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores.base import (
    ATTEMPTS,
    ATTRIBUTES,
    DATA,
    EPOCH,
    ERROR,
    FAILED_AT,
    KEY,
    LEASE_SECONDS,
    MESSAGE_ID,
    REASON,
    REPLAYED_AT,
    STATUS,
    SUBSCRIPTION,
    JobRecord,
    Snapshot,
    Status,
)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SUB = "projects/p/subscriptions/s"
TOPIC = "projects/p/topics/t"
DOC = "doc-1"
TIMEOUT_S = 60.0


class Clock:
    """The store's (server's) clock, moved by hand."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Publisher:
    """Records what would be published; ``fail`` makes every publish fail."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []
        self.fail = fail

    def __call__(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Future[str]:
        future: Future[str] = Future()
        if self.fail is not None:
            future.set_exception(self.fail)
            return future
        self.sent.append((topic, data, dict(attributes)))
        future.set_result(str(len(self.sent)))
        return future


def failed_fields(**overrides: Any) -> dict[str, Any]:
    """A job in the failure path, as the failure path writes it."""
    fields: dict[str, Any] = {
        KEY: "claim-42",
        SUBSCRIPTION: SUB,
        STATUS: Status.FAILED.value,
        EPOCH: 2,
        ATTEMPTS: 5,
        REASON: "attempts",
        ERROR: "downstream said no",
        DATA: b"doc",
        ATTRIBUTES: json.dumps({"op": "claim-42", "origin": "test"}),
        MESSAGE_ID: "m1",
        FAILED_AT: NOW,
        LEASE_SECONDS: 10.0,
    }
    fields.update(overrides)
    return fields


@pytest.fixture
def server() -> Clock:
    return Clock()


@pytest.fixture
def store(server: Clock) -> MemoryJobStore:
    return MemoryJobStore(clock=server)


def listed(store: MemoryJobStore, doc_id: str = DOC) -> FailedJob:
    snap = store.get(doc_id)
    assert snap is not None
    return FailedJob(doc_id, JobRecord.parse(snap.fields))


def run(
    store: Any,
    publisher: Publisher,
    *jobs: FailedJob,
    key_attribute: str | None = "op",
    dry_run: bool = False,
) -> list[ReplayResult]:
    return replay(
        store,
        jobs,
        topic=TOPIC,
        publish=publisher,
        key_attribute=key_attribute,
        dry_run=dry_run,
        timeout_s=TIMEOUT_S,
    )


def test_a_failed_job_is_reset_at_a_new_epoch_then_published_once(
    store: MemoryJobStore,
) -> None:
    store.create(DOC, failed_fields())
    publisher = Publisher()
    (result,) = run(store, publisher, listed(store))
    assert result.kind is ReplayOutcome.REPLAYED
    assert result.outcome == "replayed"
    assert publisher.sent == [(TOPIC, b"doc", {"op": "claim-42", "origin": "test"})]
    after = listed(store).record
    assert (after.status, after.epoch, after.attempts) == (Status.RELEASED, 3, 0)
    assert after.replayed_at is not None
    assert after.lease_expires_at is None
    assert store.writes == 2  # the create, and one conditional reset


def test_a_job_keyed_by_its_message_id_keeps_its_key(store: MemoryJobStore) -> None:
    store.create(DOC, failed_fields(**{ATTRIBUTES: json.dumps({"origin": "test"})}))
    publisher = Publisher()
    run(store, publisher, listed(store), key_attribute=None)
    assert publisher.sent == [(TOPIC, b"doc", {"origin": "test", REPLAY_OF_ATTRIBUTE: "claim-42"})]


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({STATUS: Status.COMPLETED.value}, "completed"),
        ({STATUS: Status.RUNNING.value}, "running"),
        ({EPOCH: 0, REASON: "missing_key"}, "rejected before it became a job (missing_key)"),
        ({STATUS: Status.RELEASED.value, FAILED_AT: None}, "never in the failure path"),
        ({DATA: None}, "payload too large to keep"),
        ({ATTRIBUTES: "{not json"}, "its stored attributes cannot be read"),
        ({ATTRIBUTES: json.dumps({"op": "claim-42", "n": 1})}, "its stored attributes"),
        ({ATTRIBUTES: json.dumps({"googx": "1"})}, "message breaks Pub/Sub's limits"),
        (
            {ATTRIBUTES: json.dumps({f"a{i}": "v" for i in range(101)})},
            "message breaks Pub/Sub's limits",
        ),
        ({DATA: b"x" * 10_000_001}, "message breaks Pub/Sub's limits"),
        ({STATUS: Status.RELEASED.value, REPLAYED_AT: NOW}, "replayed moments ago"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["replay", "dry-run"])
def test_a_record_that_must_not_be_replayed_is_left_untouched(
    store: MemoryJobStore, overrides: dict[str, Any], why: str, dry_run: bool
) -> None:
    store.create(DOC, failed_fields(**overrides))
    before = store.get(DOC)
    publisher = Publisher()
    (result,) = run(store, publisher, listed(store), dry_run=dry_run)
    assert result.kind is ReplayOutcome.SKIPPED
    assert result.outcome.startswith(f"skipped: {why}"), result.outcome
    assert publisher.sent == []
    after = store.get(DOC)
    assert after is not None
    assert before is not None
    assert after.version == before.version  # not one write
    assert store.writes == 1


def test_a_dry_run_writes_and_publishes_nothing(store: MemoryJobStore) -> None:
    store.create(DOC, failed_fields())
    publisher = Publisher()
    (result,) = run(store, publisher, listed(store), dry_run=True)
    assert result.kind is ReplayOutcome.DRY_RUN
    assert publisher.sent == []
    assert store.writes == 1


def request(*, owner: str, delivery: str, lease_s: float = 10) -> ClaimRequest:
    identity = derive_identity(
        subscription=SUB,
        message_id="m1",
        attributes={"op": "claim-42"},
        data=b"doc",
        key_attribute="op",
    )
    return ClaimRequest(
        identity=identity,
        owner=owner,
        message_id="m1",
        delivery=delivery,
        lease_s=lease_s,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )


def running_after_a_replay(store: MemoryJobStore, server: Clock) -> tuple[str, Any, int]:
    """A failed job, replayed once, then claimed by a worker: (doc id, owner's version, epoch)."""
    owner_request = request(owner="owner", delivery="d1")
    doc_id = owner_request.identity.doc_id
    store.create(doc_id, failed_fields())
    assert run(store, Publisher(), listed(store, doc_id))[0].kind is ReplayOutcome.REPLAYED
    server.advance(1)
    owned = claim(store, owner_request, exists_hint=True)
    assert owned.kind is ClaimKind.CLAIMED
    return doc_id, owned.version, owned.epoch


@pytest.mark.parametrize("skew_s", [-3600, 0, 3600])
def test_a_running_job_with_a_live_lease_is_never_disturbed(
    store: MemoryJobStore, server: Clock, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    doc_id, owner_version, epoch = running_after_a_replay(store, server)
    stale = FailedJob(doc_id, JobRecord.parse(failed_fields()))  # listed while it was failed
    # Judged on the store's clock: the replaying process's wall clock does not matter.
    monkeypatch.setattr(replay_module, "now_utc", lambda: server.now + timedelta(seconds=skew_s))
    server.advance(9)
    publisher = Publisher()
    (result,) = run(store, publisher, stale)
    assert result.outcome == "skipped: running"
    assert publisher.sent == []
    # The owner's next conditional write still lands: nothing moved under it.
    store.update(doc_id, {("steps", "a"): {"result": "1", "epoch": epoch}}, expected=owner_version)


def test_a_replay_fences_an_owner_whose_lease_lapsed(store: MemoryJobStore, server: Clock) -> None:
    doc_id, owner_version, epoch = running_after_a_replay(store, server)
    server.advance(10)  # the owner stalled: its lease ran out on the store's clock
    publisher = Publisher()
    stale = FailedJob(doc_id, JobRecord.parse(failed_fields()))
    (result,) = run(store, publisher, stale)
    assert result.kind is ReplayOutcome.REPLAYED
    assert len(publisher.sent) == 1
    after = listed(store, doc_id).record
    assert (after.status, after.epoch) == (Status.RELEASED, epoch + 1)
    with pytest.raises(VersionConflict):
        store.update(
            doc_id, {("steps", "a"): {"result": "1", "epoch": epoch}}, expected=owner_version
        )


def test_an_interrupted_replay_is_replayed_again_once_its_window_passed(
    store: MemoryJobStore, server: Clock
) -> None:
    store.create(DOC, failed_fields())
    broken = Publisher(fail=RuntimeError("publisher is down"))
    (first,) = run(store, broken, listed(store))
    assert first.kind is ReplayOutcome.FAILED
    assert "publisher is down" in first.outcome
    reset = listed(store).record
    assert (reset.status, reset.epoch) == (Status.RELEASED, 3)  # the reset stands

    publisher = Publisher()
    server.advance(TIMEOUT_S - 1)
    (early,) = run(store, publisher, listed(store))
    assert early.outcome.startswith("skipped: replayed moments ago")
    server.advance(1.5)
    (again,) = run(store, publisher, listed(store))
    assert again.kind is ReplayOutcome.REPLAYED
    assert len(publisher.sent) == 1
    assert listed(store).record.epoch == 4


class WriterBetweenReadAndReset(MemoryJobStore):
    """Someone else writes the document right after each read: the reset always conflicts."""

    def get(self, doc_id: str) -> Snapshot | None:
        snap = super().get(doc_id)
        if snap is not None:
            super().update(doc_id, {("error",): "a worker wrote"}, expected=snap.version)
        return snap


def test_a_reset_that_conflicts_publishes_nothing() -> None:
    store = WriterBetweenReadAndReset()
    store.create(DOC, failed_fields())
    publisher = Publisher()
    (result,) = run(store, publisher, FailedJob(DOC, JobRecord.parse(failed_fields())))
    assert result.outcome == "skipped: changed meanwhile"
    assert publisher.sent == []
    snap = MemoryJobStore.get(store, DOC)
    assert snap is not None
    assert snap.fields[STATUS] == Status.FAILED.value


class ReadTogether(MemoryJobStore):
    """Every replay reads before any of them resets: the worst interleaving, every time."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self._barrier = threading.Barrier(parties, timeout=10)

    def get(self, doc_id: str) -> Snapshot | None:
        snap = super().get(doc_id)
        self._barrier.wait()
        return snap


def test_concurrent_replays_of_one_job_publish_once() -> None:
    store = ReadTogether(parties=8)
    store.create(DOC, failed_fields())
    job = FailedJob(DOC, JobRecord.parse(failed_fields()))
    publisher = Publisher()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: run(store, publisher, job)[0], range(8)))
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == ["replayed"] + ["skipped: changed meanwhile"] * 7
    assert len(publisher.sent) == 1
    snap = MemoryJobStore.get(store, DOC)
    assert snap is not None
    assert snap.fields[EPOCH] == 3


def test_a_replay_that_reads_another_replays_reset_publishes_nothing(
    store: MemoryJobStore,
) -> None:
    store.create(DOC, failed_fields())
    job = listed(store)
    publisher = Publisher()
    assert run(store, publisher, job)[0].kind is ReplayOutcome.REPLAYED
    (second,) = run(store, publisher, job)  # same listing, read after the first reset
    assert second.outcome.startswith("skipped: replayed moments ago")
    assert len(publisher.sent) == 1


class FailingStore(MemoryJobStore):
    """A store whose reads fail for one document."""

    def get(self, doc_id: str) -> Snapshot | None:
        if doc_id == "broken":
            raise StoreError("Firestore get failed after 9 tries")
        return super().get(doc_id)


def test_one_jobs_store_error_is_its_outcome_and_the_others_are_replayed() -> None:
    store = FailingStore()
    store.create(DOC, failed_fields())
    publisher = Publisher()
    broken = FailedJob("broken", JobRecord.parse(failed_fields()))
    first, second = run(store, publisher, broken, listed(store))
    assert first.outcome == "skipped: the job store failed: Firestore get failed after 9 tries"
    assert second.kind is ReplayOutcome.REPLAYED
    assert len(publisher.sent) == 1


def test_a_missing_record_is_skipped(store: MemoryJobStore) -> None:
    job = FailedJob("gone", JobRecord.parse(failed_fields()))
    assert run(store, Publisher(), job)[0].outcome == "skipped: the record is gone"


@pytest.mark.parametrize(
    ("stored", "parsed"),
    [
        (json.dumps({"op": "k", "ü": "✓"}), {"op": "k", "ü": "✓"}),
        ({"op": "k"}, {"op": "k"}),
        (None, {}),
        ("{broken", None),
        (json.dumps(["op", "k"]), None),
        (json.dumps({"op": 1}), None),
    ],
)
def test_job_record_reads_the_failure_paths_fields(stored: Any, parsed: Any) -> None:
    fields = failed_fields(**{ATTRIBUTES: stored, REPLAYED_AT: NOW})
    record = JobRecord.parse(fields)
    assert record.attributes == parsed
    assert (record.key, record.subscription, record.reason) == ("claim-42", SUB, "attempts")
    assert (record.data, record.message_id, record.failed_at) == (b"doc", "m1", NOW)
    assert (record.replayed_at, record.lease_s) == (NOW, 10.0)
