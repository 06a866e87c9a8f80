"""The reviewed failure path and its replay, through the ``pubsub-worker`` command."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker.cli import main
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores.base import Status
from tests.support.job_documents import put_job
from tests.support.observe import end_stale_streams, pull_now

from .conftest import pull_all

pytestmark = pytest.mark.emulator


def _env(
    monkeypatch: pytest.MonkeyPatch, emulators: Emulators, settings: pubsub_worker.Settings
) -> None:
    for name, value in emulators.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", settings.subscription_path)
    monkeypatch.setenv("PUBSUB_WORKER_COLLECTION", settings.collection)
    if settings.key_attribute:
        monkeypatch.setenv("PUBSUB_WORKER_KEY_ATTRIBUTE", settings.key_attribute)


@pytest.mark.parametrize("key_attribute", ["op", None], ids=["key-attribute", "message-id"])
def test_replay_revives_a_failed_job_without_repeating_its_completed_steps(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    key_attribute: str | None,
) -> None:
    review = make_subscription(exactly_once=False)
    settings = settings_for(
        eod_subscription, key_attribute=key_attribute, failure_topic=review.topic_path
    )
    effects: list[tuple[str, str]] = []
    broken = {"b": True}

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def a() -> str:
            effects.append(("a", job.key))
            return "a-done"

        job.step("a", a)

        def b() -> str:
            if broken["b"]:
                raise pubsub_worker.PermanentError("downstream rejected the document")
            effects.append(("b", job.key))
            return "b-done"

        job.step("b", b)

    attributes = {"op": "claim-42"} if key_attribute else {}
    with worker(handle, settings) as w:
        message_id = publisher.publish(eod_subscription.topic_path, b"doc", **attributes).result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 1)
    key = "claim-42" if key_attribute else message_id
    assert effects == [("a", key)]
    assert len(pull_all(subscriber, review.subscription_path)) == 1

    _env(monkeypatch, emulators, settings)
    capsys.readouterr()
    assert main(["jobs", "list", "--status", "failed", "--output", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["jobs"]
    assert [(row["key"], row["status"], row["reason"]) for row in listed] == [
        (key, "failed", "permanent")
    ]

    broken["b"] = False  # the reviewer fixed the cause
    # The stopped worker's stream may linger at the emulator and swallow the replayed
    # message for a lease (docs/emulator.md); end it before the next worker starts.
    end_stale_streams(subscriber, eod_subscription.subscription_path)
    assert main(["jobs", "replay", "--all-failed"]) == 2  # no replay subscription: refused
    assert "jobs replay-setup" in capsys.readouterr().err
    assert main(["jobs", "replay-setup"]) == 0
    capsys.readouterr()
    with worker(handle, settings) as w:  # it consumes the replay subscription beside its own
        assert main(["jobs", "replay", "--all-failed"]) == 0
        out = capsys.readouterr().out
        assert f"[1/1] {key}: replayed" in out
        assert f"reaches only {settings.replay_subscription_path}" in out
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1, timeout_s=60)
    assert effects == [("a", key), ("b", key)]  # step a was not repeated

    assert main(["jobs", "list", "--status", "failed", "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == []


def test_cli_reports_bad_configuration_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PUBSUB_WORKER_LEASE_SECONDS", "3")
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err
    assert "PUBSUB_WORKER_LEASE_SECONDS" in err
    assert "Traceback" not in err


def test_a_replay_reaches_only_its_own_subscription_unless_fan_out_is_asked_for(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    firestore_client: Any,
    worker: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sibling subscription of the same topic (another consumer, wrapped or not) counts
    what it gets: nothing from a replay, which goes to the replay topic that only this
    subscription's worker reads; the replayed job runs there, recorded under its own
    subscription. ``--fan-out``, asked for by name, reaches the sibling too."""
    settings = settings_for(eod_subscription, key_attribute="op")
    sibling = eod_subscription.subscription_path + "-sibling"
    subscriber.create_subscription(request={"name": sibling, "topic": eod_subscription.topic_path})
    store = FirestoreJobStore(firestore_client, settings.collection)
    _env(monkeypatch, emulators, settings)
    try:
        put_job(store, settings.subscription_path, "order-7", Status.FAILED)
        assert main(["jobs", "replay-setup"]) == 0
        assert main(["jobs", "replay-setup"]) == 0  # idempotent
        capsys.readouterr()
        assert main(["jobs", "replay", "order-7", "--dry-run"]) == 0
        dry = capsys.readouterr().out
        assert f"order-7: would replay to {settings.replay_topic_path}" in dry
        assert f"reaches only {settings.replay_subscription_path}" in dry
        assert pull_now(subscriber, sibling) == []

        ran: list[str] = []

        def handle(message: Any, job: pubsub_worker.Job) -> None:
            job.step("charge", lambda: ran.append(job.key))

        with worker(handle, settings) as w:
            assert main(["jobs", "replay", "order-7"]) == 0
            w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1, timeout_s=60)
        assert ran == ["order-7"]
        assert pull_all(subscriber, sibling, quiet_s=2.0) == []  # the sibling got nothing

        put_job(store, settings.subscription_path, "order-8", Status.FAILED)
        assert main(["jobs", "replay", "order-8", "--fan-out"]) == 0
        assert "fans out to 2 subscription(s)" in capsys.readouterr().out
        reached = pull_all(subscriber, sibling, quiet_s=2.0)
        assert [m.attributes["op"] for m in reached] == ["order-8"]
    finally:
        subscriber.delete_subscription(request={"subscription": sibling})
        subscriber.delete_subscription(request={"subscription": settings.replay_subscription_path})
        publisher.delete_topic(request={"topic": settings.replay_topic_path})
