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
from tests.support.observe import end_stale_streams

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
    with worker(handle, settings) as w:
        assert main(["jobs", "replay", "--all-failed"]) == 0
        out = capsys.readouterr().out
        assert f"[1/1] {key}: replayed" in out
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
