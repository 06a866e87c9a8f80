"""Replay is fenced: against the real emulators, on every Firestore store.

A replay reads the job through the store, decides on what it read (server
times included) and resets it with one conditional update that bumps the
epoch. These tests pin what that buys: a running job's owner is never
disturbed, concurrent replays publish once, a stale owner's next write is
rejected, and a conflict is one line of output, never a traceback.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from pubsub_worker import cli
from pubsub_worker._job.claim import Claim, ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import derive_identity
from pubsub_worker._job.lease import now_utc
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, ReplayResult, list_failed, replay
from pubsub_worker.cli import environment as cli_environment
from pubsub_worker.errors import VersionConflict
from pubsub_worker.stores import BatchingFirestoreJobStore, FirestoreJobStore
from pubsub_worker.stores.base import (
    ATTEMPTS,
    ATTRIBUTES,
    DATA,
    EPOCH,
    ERROR,
    FAILED_AT,
    KEY,
    MESSAGE_ID,
    REASON,
    STATUS,
    SUBSCRIPTION,
    JobRecord,
    Snapshot,
    Status,
)

from .conftest import pull_all

pytestmark = pytest.mark.emulator

KEY_VALUE = "claim-42"


@pytest.fixture(params=["plain", "batching"])
def store(
    request: pytest.FixtureRequest, firestore_client: Any, firestore_collection: str
) -> Iterator[FirestoreJobStore]:
    if request.param == "plain":
        yield FirestoreJobStore(firestore_client, firestore_collection)
        return
    batching = BatchingFirestoreJobStore(firestore_client, firestore_collection)
    yield batching
    batching.close()


@pytest.fixture
def target(make_subscription: Any) -> SubscriptionHandle:
    """The topic replays publish to, and a subscription that counts what arrived."""
    handle: SubscriptionHandle = make_subscription(exactly_once=False)
    return handle


def claim_request(subscription: str, *, owner: str, lease_s: float = 10) -> ClaimRequest:
    identity = derive_identity(
        subscription=subscription,
        message_id="m-1",
        attributes={"op": KEY_VALUE},
        data=b"doc",
        key_attribute="op",
    )
    return ClaimRequest(
        identity=identity,
        owner=owner,
        message_id="m-1",
        delivery=f"delivery-of-{owner}",
        lease_s=lease_s,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )


def make_failed(store: FirestoreJobStore, subscription: str) -> str:
    """A job in the failure path, as the failure path records it; its document id."""
    doc_id = claim_request(subscription, owner="first").identity.doc_id
    store.create(
        doc_id,
        {
            KEY: KEY_VALUE,
            SUBSCRIPTION: subscription,
            STATUS: Status.FAILED.value,
            EPOCH: 2,
            ATTEMPTS: 5,
            REASON: "attempts",
            ERROR: "downstream said no",
            DATA: b"doc",
            ATTRIBUTES: json.dumps({"op": KEY_VALUE}),
            MESSAGE_ID: "m-1",
            FAILED_AT: now_utc(),
        },
    )
    return doc_id


def publish_to(publisher: Any) -> Callable[[str, bytes, Mapping[str, str]], Any]:
    def publish(topic: str, data: bytes, attributes: Mapping[str, str]) -> Any:
        return publisher.publish(topic, data, **attributes)

    return publish


def run_replay(store: Any, jobs: list[FailedJob], publisher: Any, topic: str) -> list[ReplayResult]:
    return replay(
        store,
        jobs,
        topic=topic,
        publish=publish_to(publisher),
        key_attribute="op",
        timeout_s=30,
    )


def record_of(store: FirestoreJobStore, doc_id: str) -> JobRecord:
    snap = store.get(doc_id)
    assert snap is not None
    return JobRecord.parse(snap.fields)


def test_replaying_a_running_job_leaves_its_owner_undisturbed(
    store: FirestoreJobStore,
    firestore_client: Any,
    firestore_collection: str,
    publisher: Any,
    subscriber: Any,
    target: SubscriptionHandle,
) -> None:
    sub = target.subscription_path
    doc_id = make_failed(store, sub)
    listed = list(list_failed(firestore_client, firestore_collection, sub))
    assert [job.doc_id for job in listed] == [doc_id]
    assert [r.outcome for r in run_replay(store, listed, publisher, target.topic_path)] == [
        "replayed"
    ]
    # A worker claims the replayed job and holds a live lease.
    owner = claim(store, claim_request(sub, owner="worker"), exists_hint=True)
    assert owner.kind is ClaimKind.CLAIMED
    assert owner.epoch == 4  # failed at 2, replayed at 3, claimed at 4

    by_key = list(list_failed(firestore_client, firestore_collection, sub, keys=[KEY_VALUE]))
    for jobs in (listed, by_key):  # an operator's stale listing, and a fresh one
        results = run_replay(store, jobs, publisher, target.topic_path)
        assert [r.outcome for r in results] == ["skipped: running"]

    # The owner's next conditional write lands: nothing moved under it.
    store.update(doc_id, {("steps", "a"): {"result": "1", "epoch": 4}}, expected=owner.version)
    assert record_of(store, doc_id).epoch == 4
    assert len(pull_all(subscriber, sub)) == 1  # the first replay's message, no other


class ReadTogether:
    """A store whose reads wait for each other: every replay reads before any resets."""

    def __init__(self, store: FirestoreJobStore, parties: int) -> None:
        self._store = store
        self._barrier = threading.Barrier(parties, timeout=30)

    def get(self, doc_id: str) -> Snapshot | None:
        snap = self._store.get(doc_id)
        self._barrier.wait()
        return snap

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_concurrent_replays_of_one_job_publish_once(
    store: FirestoreJobStore,
    firestore_client: Any,
    firestore_collection: str,
    publisher: Any,
    subscriber: Any,
    target: SubscriptionHandle,
) -> None:
    sub = target.subscription_path
    doc_id = make_failed(store, sub)
    jobs = list(list_failed(firestore_client, firestore_collection, sub))
    together = ReadTogether(store, parties=8)

    def one(_: int) -> str:
        (result,) = run_replay(together, jobs, publisher, target.topic_path)
        return result.outcome

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(one, range(8)))
    assert outcomes == ["replayed"] + ["skipped: changed meanwhile"] * 7
    assert record_of(store, doc_id).epoch == 3
    assert len(pull_all(subscriber, sub)) == 1


def test_replays_racing_from_listing_to_publish_publish_once(
    store: FirestoreJobStore,
    firestore_client: Any,
    firestore_collection: str,
    publisher: Any,
    subscriber: Any,
    target: SubscriptionHandle,
) -> None:
    """No synchronisation: each replay lists by key and replays, as eight operators would."""
    sub = target.subscription_path
    doc_id = make_failed(store, sub)
    start = threading.Barrier(8, timeout=30)

    def one(_: int) -> list[ReplayResult]:
        start.wait()
        jobs = list(list_failed(firestore_client, firestore_collection, sub, keys=[KEY_VALUE]))
        return run_replay(store, jobs, publisher, target.topic_path)

    with ThreadPoolExecutor(8) as pool:
        results = [r for batch in pool.map(one, range(8)) for r in batch]
    replayed = [r for r in results if r.kind is ReplayOutcome.REPLAYED]
    assert len(replayed) == 1
    skipped = {r.outcome.split(" (")[0] for r in results if r not in replayed}
    assert skipped <= {"skipped: changed meanwhile", "skipped: replayed moments ago"}
    assert record_of(store, doc_id).epoch == 3
    assert len(pull_all(subscriber, sub)) == 1


def test_a_replay_bumps_the_epoch_and_the_stale_owners_next_write_is_rejected(
    store: FirestoreJobStore,
    firestore_client: Any,
    firestore_collection: str,
    publisher: Any,
    subscriber: Any,
    target: SubscriptionHandle,
) -> None:
    sub = target.subscription_path
    doc_id = make_failed(store, sub)
    jobs = list(list_failed(firestore_client, firestore_collection, sub))
    run_replay(store, jobs, publisher, target.topic_path)
    stale: Claim = claim(store, claim_request(sub, owner="stalled", lease_s=1), exists_hint=True)
    assert stale.kind is ClaimKind.CLAIMED
    time.sleep(1.5)  # the owner stalls past its lease (on the server's clock)

    by_key = list(list_failed(firestore_client, firestore_collection, sub, keys=[KEY_VALUE]))
    assert [r.outcome for r in run_replay(store, by_key, publisher, target.topic_path)] == [
        "replayed"
    ]
    after = record_of(store, doc_id)
    assert (after.status, after.epoch, after.attempts) == (Status.RELEASED, stale.epoch + 1, 0)
    with pytest.raises(VersionConflict):
        store.update(
            doc_id, {("steps", "a"): {"result": "1", "epoch": stale.epoch}}, expected=stale.version
        )
    assert "a" not in record_of(store, doc_id).steps
    assert len(pull_all(subscriber, sub)) == 2  # one per replay


class WriterAfterRead:
    """A store after whose every read another writer changes the document (a worker, say)."""

    def __init__(self, store: FirestoreJobStore, other: FirestoreJobStore) -> None:
        self._store = store
        self._other = other

    def get(self, doc_id: str) -> Snapshot | None:
        snap = self._store.get(doc_id)
        if snap is not None:
            self._other.update(doc_id, {(ERROR,): "written meanwhile"}, expected=snap.version)
        return snap

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _cli_env(
    monkeypatch: pytest.MonkeyPatch, emulators: Emulators, subscription: str, collection: str
) -> None:
    for name, value in emulators.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", subscription)
    monkeypatch.setenv("PUBSUB_WORKER_COLLECTION", collection)
    monkeypatch.setenv("PUBSUB_WORKER_KEY_ATTRIBUTE", "op")


def test_the_cli_reports_a_conflict_in_one_line_and_publishes_nothing(
    emulators: Emulators,
    firestore_client: Any,
    firestore_collection: str,
    subscriber: Any,
    target: SubscriptionHandle,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sub = target.subscription_path
    plain = FirestoreJobStore(firestore_client, firestore_collection)
    doc_id = make_failed(plain, sub)
    _cli_env(monkeypatch, emulators, sub, firestore_collection)
    real_store = cli_environment.job_store

    def racing_store(settings: Any) -> Any:
        return WriterAfterRead(real_store(settings), plain)

    monkeypatch.setattr(cli_environment, "job_store", racing_store)
    capsys.readouterr()
    assert cli.main(["jobs", "replay", "--all-failed", "--fan-out"]) == 1
    captured = capsys.readouterr()
    assert f"[1/1] {KEY_VALUE}: skipped: changed meanwhile" in captured.out
    assert "replayed 0 of 1 job(s)" in captured.out
    assert "Traceback" not in captured.out + captured.err
    after = record_of(plain, doc_id)
    assert (after.status, after.epoch, after.error) == (Status.FAILED, 2, "written meanwhile")
    assert pull_all(subscriber, sub) == []


def test_the_cli_skips_a_running_job_in_one_line(
    emulators: Emulators,
    firestore_client: Any,
    firestore_collection: str,
    publisher: Any,
    subscriber: Any,
    target: SubscriptionHandle,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sub = target.subscription_path
    plain = FirestoreJobStore(firestore_client, firestore_collection)
    doc_id = make_failed(plain, sub)
    _cli_env(monkeypatch, emulators, sub, firestore_collection)
    capsys.readouterr()
    assert cli.main(["jobs", "replay", KEY_VALUE, "--fan-out"]) == 0
    assert f"[1/1] {KEY_VALUE}: replayed" in capsys.readouterr().out
    owner = claim(plain, claim_request(sub, owner="worker"), exists_hint=True)
    assert owner.kind is ClaimKind.CLAIMED

    assert cli.main(["jobs", "replay", KEY_VALUE, "--fan-out"]) == 1
    captured = capsys.readouterr()
    assert f"[1/1] {KEY_VALUE}: skipped: running" in captured.out
    assert "Traceback" not in captured.out + captured.err
    assert record_of(plain, doc_id).epoch == owner.epoch
    assert len(pull_all(subscriber, sub)) == 1
