"""``pubsub-worker jobs``: show, list, release and replay against the real emulators.

The jobs are made by a real in-process worker (its steps, outbox and
failure path write the documents), and each command is the CLI's ``main``
with the same environment an operator's shell would have.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import derive_identity
from pubsub_worker.cli import main
from pubsub_worker.errors import VersionConflict
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores.base import JobRecord, Status
from tests.support.observe import end_stale_streams, job_document, step_epochs

pytestmark = pytest.mark.emulator


@pytest.fixture
def cli_env(
    monkeypatch: pytest.MonkeyPatch, emulators: Emulators
) -> Callable[[pubsub_worker.Settings], None]:
    def apply(settings: pubsub_worker.Settings) -> None:
        for name, value in emulators.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", settings.subscription_path)
        monkeypatch.setenv("PUBSUB_WORKER_COLLECTION", settings.collection)
        monkeypatch.setenv("PUBSUB_WORKER_LEASE_SECONDS", str(settings.lease_seconds))
        if settings.key_attribute:
            monkeypatch.setenv("PUBSUB_WORKER_KEY_ATTRIBUTE", settings.key_attribute)

    return apply


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_show_and_list_a_running_a_completed_and_a_failed_job(
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    cli_env: Callable[[pubsub_worker.Settings], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out_topic = make_subscription(exactly_once=False)
    settings = settings_for(eod_subscription, key_attribute="op", max_processing_seconds=120)
    cli_env(settings)
    hold = threading.Event()
    held = threading.Event()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("upload", lambda: {"url": "gs://bucket/" + job.key})
        if job.key == "failing":
            job.step("check", _reject)
        if job.key == "running":
            job.step("hold", lambda: _hold(job, held, hold))
        job.publish(out_topic.topic_path, b"done:" + message.data)

    with worker(handle, settings) as w:
        for key in ("completed", "failing"):
            publisher.publish(eod_subscription.topic_path, b"doc", op=key).result()
            w.wait_for(lambda: w.counter(Counter.COMPLETED) + w.counter(Counter.FAILED) >= 1)
        w.wait_for(lambda: w.counter(Counter.COMPLETED) + w.counter(Counter.FAILED) == 2)
        publisher.publish(eod_subscription.topic_path, b"doc", op="running").result()
        assert held.wait(30)
        try:
            code, out, _ = run_cli(capsys, "jobs", "show", "running", "--output", "json")
            assert code == 0
            shown = json.loads(out)
            assert (shown["key"], shown["status"], shown["epoch"], shown["attempts"]) == (
                "running",
                "running",
                1,
                1,
            )
            assert shown["owner"].split("/")[1] == str(os.getpid())  # host/pid/random
            assert 0 < shown["lease_left_s"] <= settings.lease_seconds
            assert [(s["name"], s["epoch"]) for s in shown["steps"]] == [("upload", 1)]
            assert shown["steps"][0]["size_bytes"] == len(
                '{"url":"gs://bucket/running"}'
            )  # compact JSON
            assert shown["outbox"] == []

            code, out, _ = run_cli(capsys, "jobs", "show", "completed")
            assert code == 0
            assert "status       completed (epoch 1, attempts 1)" in out
            assert "last owner" in out
            assert "outbox       1:" in out
            assert "sent" in out
            assert "NOT SENT" not in out

            code, out, _ = run_cli(capsys, "jobs", "show", "failing")
            assert "status       failed (epoch 1, attempts 1)" in out
            assert "reason       permanent" in out
            assert "last error   PermanentError: no such document" in out

            code, out, _ = run_cli(capsys, "jobs", "list")
            lines = out.splitlines()
            assert code == 0
            assert [line.split()[0] for line in lines[1:4]] == ["running", "failing", "completed"]
            assert lines[-1] == f"3 job(s) on {settings.subscription_path}, newest first"
            assert "s left" in lines[1]

            code, out, _ = run_cli(
                capsys, "jobs", "list", "--status", "running", "--output", "json"
            )
            assert [job["key"] for job in json.loads(out)["jobs"]] == ["running"]
            code, out, _ = run_cli(capsys, "jobs", "list", "--older-than", "1h")
            assert out.splitlines()[-1].startswith("0 job(s)")

            # Paged: two pages of two, newest first, nothing lost or repeated.
            code, out, _ = run_cli(capsys, "jobs", "list", "--limit", "2", "--output", "json")
            first = json.loads(out)
            assert [job["key"] for job in first["jobs"]] == ["running", "failing"]
            assert first["next"]
            code, out, _ = run_cli(capsys, "jobs", "list", "--limit", "2")
            assert out.splitlines()[-1] == (
                f"next page: pubsub-worker jobs list --limit 2 --after {first['next']}"
            )
            code, out, _ = run_cli(
                capsys, "jobs", "list", "--limit", "2", "--after", first["next"], "--output", "json"
            )
            second = json.loads(out)
            assert ([job["key"] for job in second["jobs"]], second["next"]) == (["completed"], None)
        finally:
            hold.set()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 2)

    code, _, err = run_cli(capsys, "jobs", "show", "never-seen")
    assert code == 4
    assert err == f"pubsub-worker: no job never-seen on {settings.subscription_path}\n"


def _hold(job: pubsub_worker.Job, held: threading.Event, hold: threading.Event) -> None:
    held.set()
    while not hold.wait(0.2):
        job.heartbeat()


def _reject() -> None:
    raise pubsub_worker.PermanentError("no such document")


def stuck_owner(store: FirestoreJobStore, subscription: str, key: str, lease_s: float = 60) -> Any:
    """A claim of ``key`` by an owner that then stops writing (paused, say)."""
    identity = derive_identity(
        subscription=subscription,
        message_id="m-1",
        attributes={"op": key},
        data=b"doc",
        key_attribute="op",
    )
    request = ClaimRequest(
        identity=identity,
        owner="stuck-host/1234/cafe",
        message_id="m-1",
        delivery="d-1",
        lease_s=lease_s,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )
    owner = claim(store, request)
    assert owner.kind is ClaimKind.CLAIMED
    version = store.update(
        identity.doc_id, {("steps", "a"): {"result": "1", "epoch": 1}}, expected=owner.version
    )
    return identity.doc_id, version


def test_release_fences_a_live_owner_and_refuses_what_cannot_be_released(
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    cli_env: Callable[[pubsub_worker.Settings], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    cli_env(settings)
    store = FirestoreJobStore(firestore_client, firestore_collection)
    sub = settings.subscription_path
    doc_id, version = stuck_owner(store, sub, "claim-42")

    code, out, _ = run_cli(capsys, "jobs", "release", "claim-42", "--epoch", "1")

    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "released claim-42: epoch 1 -> 2, status running -> released"
    assert "fenced owner stuck-host/1234/cafe (message m-1)" in lines[1]
    assert "s left (Firestore's clock); steps kept: a; attempts stay 1" in lines[2]
    snap = store.get(doc_id)
    assert snap is not None
    record = JobRecord.parse(snap.fields)
    assert (record.status, record.epoch, list(record.steps)) == (Status.RELEASED, 2, ["a"])
    with pytest.raises(VersionConflict):  # the stuck owner's next write
        store.update(doc_id, {("steps", "b"): {"result": "2", "epoch": 1}}, expected=version)

    code, out, _ = run_cli(capsys, "jobs", "release", "claim-42")
    assert (code, out.strip()) == (
        0,
        "claim-42: already released at epoch 2: no owner holds it; its next delivery claims it",
    )
    code, _, err = run_cli(capsys, "jobs", "release", "claim-42", "--epoch", "1")
    assert code == 1
    assert "not released: at epoch 2, not 1" in err

    store.update(doc_id, {("status",): Status.COMPLETED.value}, expected=store.get(doc_id).version)  # type: ignore[union-attr]
    code, _, err = run_cli(capsys, "jobs", "release", "claim-42")
    assert code == 1
    assert "claim-42: not released: completed: nothing to release" in err
    assert JobRecord.parse(store.get(doc_id).fields).epoch == 2  # type: ignore[union-attr]
    code, _, err = run_cli(capsys, "jobs", "release", "nobody")
    assert (code, "no job has this key" in err) == (4, True)


def test_jobs_replay_revives_failed_jobs_without_repeating_a_step(
    subscriber: Any,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    cli_env: Callable[[pubsub_worker.Settings], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    cli_env(settings)
    runs: list[tuple[str, str, int]] = []
    broken = {"b": True}

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def a() -> str:
            runs.append(("a", job.key, job.epoch))
            return "a"

        def b() -> str:
            if broken["b"]:
                raise pubsub_worker.PermanentError("downstream said no")
            runs.append(("b", job.key, job.epoch))
            return "b"

        job.step("a", a)
        job.step("b", b)

    keys = ["k1", "k2", "k3"]
    with worker(handle, settings) as w:
        for key in keys:
            publisher.publish(eod_subscription.topic_path, b"doc-" + key.encode(), op=key).result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 3)
    assert sorted(runs) == [("a", key, 1) for key in keys]

    # The topic has this one subscription: fan-out, asked for by name, reaches it alone.
    code, out, _ = run_cli(capsys, "jobs", "replay", "--all-failed", "--dry-run", "--fan-out")
    assert code == 0
    listed = [line.split("] ", 1) for line in out.splitlines() if line.startswith("[")]
    assert sorted(n for n, _ in listed) == ["[1/3", "[2/3", "[3/3"]
    topic = eod_subscription.topic_path
    assert sorted(outcome for _, outcome in listed) == [
        f"{key}: would replay to {topic}" for key in keys
    ]
    assert f"would replay 3 of 3 job(s) to {eod_subscription.topic_path}" in out
    assert "  dry run: nothing was written or published" in out
    assert "replayed" not in out

    broken["b"] = False
    end_stale_streams(subscriber, eod_subscription.subscription_path)
    with worker(handle, settings) as w:
        code, out, _ = run_cli(capsys, "jobs", "replay", "k1", "k2", "k3", "k1", "--fan-out")
        assert code == 0
        assert f"replayed 3 of 3 job(s) to {eod_subscription.topic_path}" in out
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 3, timeout_s=60)
        code, out, _ = run_cli(capsys, "jobs", "replay", "k1", "k2", "--fan-out")
        assert code == 1
        assert out.splitlines()[-1] == "  skipped 2: completed (2)"

    # Step a ran once per job (epoch 1) and was skipped on the replay; b ran once, at epoch 3.
    assert sorted(runs) == sorted([("a", k, 1) for k in keys] + [("b", k, 3) for k in keys])
    for key in keys:
        doc = job_document(firestore_client, settings.collection, settings.subscription_path, key)
        assert (doc["status"], step_epochs(doc)) == ("completed", {"a": 1, "b": 3})

    code, _, err = run_cli(capsys, "jobs", "replay")
    assert code == 2
    assert "give job keys or --all-failed" in err
