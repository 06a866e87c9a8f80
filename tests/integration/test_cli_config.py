"""``pubsub-worker config`` against the real emulators: every finding, exactly."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from emulator import (
    Emulators,
    RetrySpec,
    SubscriptionHandle,
    subscription_path,
    topic_path,
    unique_id,
)
from pubsub_worker.cli import main

pytestmark = pytest.mark.emulator


def configure(monkeypatch: pytest.MonkeyPatch, emulators: Emulators, **variables: str) -> None:
    for name, value in emulators.env().items():
        monkeypatch.setenv(name, value)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def config_json(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["config", "--output", "json"])
    return code, json.loads(capsys.readouterr().out)


def findings(document: dict[str, Any]) -> dict[str, str]:
    return {check["check"]: check["level"] for check in document["checks"]}


def test_a_non_exactly_once_subscription_and_a_missing_failure_topic_are_problems(
    emulators: Emulators,
    make_subscription: Any,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = make_subscription(exactly_once=False, ack_deadline_seconds=10)
    configure(
        monkeypatch,
        emulators,
        PUBSUB_WORKER_SUBSCRIPTION=plain.subscription_path,
        PUBSUB_WORKER_COLLECTION=firestore_collection,
        PUBSUB_WORKER_FAILURE_TOPIC="no-such-topic",
        PUBSUB_WORKER_LEASE_SECONDS="30",
    )

    code, document = config_json(capsys)

    assert code == 1
    assert document["problems"] == 2
    assert findings(document) == {
        "subscription": "ok",
        "exactly-once delivery": "problem",
        "message ordering": "ok",
        "ack deadline": "warning",
        "retry policy": "hint",
        "dead-letter policy": "ok",
        "subscription's topic": "ok",
        "replay": "warning",  # no replay subscription: jobs replay would refuse
        "failure topic": "problem",
        "Firestore": "ok",
        "TTL policy": "hint",
        "indexes": "hint",
        "dashboard indexes": "hint",
        "index exemptions": "hint",
    }
    settings = {row["variable"]: row for row in document["settings"]}
    assert settings["PUBSUB_WORKER_FAILURE_TOPIC"] == {
        "variable": "PUBSUB_WORKER_FAILURE_TOPIC",
        "value": "no-such-topic",
        "source": "environment",
    }
    assert settings["PUBSUB_WORKER_MAX_ATTEMPTS"]["source"] == "default"

    capsys.readouterr()
    assert main(["config"]) == 1
    out = capsys.readouterr().out
    problems = out[out.index("2 problem(s):") :].splitlines()
    assert problems[1].startswith("  - exactly-once delivery: off: the worker refuses to start")
    assert problems[2] == (
        f"  - failure topic: projects/{emulators.project}/topics/no-such-topic does not exist: "
        "the worker refuses to start; create it (gcloud pubsub topics create no-such-topic) "
        "or unset PUBSUB_WORKER_FAILURE_TOPIC"
    )


def test_a_subscription_set_up_for_the_worker_passes_with_its_warnings(
    emulators: Emulators,
    make_subscription: Any,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    subscription: SubscriptionHandle = make_subscription(
        exactly_once=True,
        ack_deadline_seconds=20,
        max_delivery_attempts=5,
        retry=RetrySpec(min_backoff_seconds=10, max_backoff_seconds=600),
    )
    review = make_subscription(exactly_once=False)
    configure(
        monkeypatch,
        emulators,
        PUBSUB_WORKER_SUBSCRIPTION=subscription.subscription_path,
        PUBSUB_WORKER_COLLECTION=firestore_collection,
        PUBSUB_WORKER_FAILURE_TOPIC=review.topic_path,
        PUBSUB_WORKER_LEASE_SECONDS="20",
        CLOUD_RUN_WORKER_POOL="orders-worker",
    )
    assert main(["jobs", "replay-setup"]) == 0  # replays reach this subscription alone
    capsys.readouterr()

    code, document = config_json(capsys)

    assert code == 0
    assert document["problems"] == 0
    assert findings(document) == {
        "subscription": "ok",
        "exactly-once delivery": "ok",
        "message ordering": "ok",
        "ack deadline": "ok",
        "retry policy": "ok",
        "dead-letter policy": "warning",  # 5 deliveries: not more than MAX_ATTEMPTS
        "subscription's topic": "ok",
        "dead-letter topic": "ok",
        "replay": "ok",
        "failure topic": "ok",
        "Firestore": "ok",
        "TTL policy": "hint",
        "indexes": "hint",
        "dashboard indexes": "hint",
        "index exemptions": "hint",
    }
    settings = {row["variable"]: row for row in document["settings"]}
    assert settings["PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS"] == {
        "variable": "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS",
        "value": "5.0",
        "source": "CLOUD_RUN_WORKER_POOL default",
    }
    capsys.readouterr()
    assert main(["config"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no problems (1 warning(s))"


def test_a_missing_subscription_and_an_unreachable_firestore_are_problems(
    emulators: Emulators,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    configure(
        monkeypatch,
        emulators,
        PUBSUB_WORKER_SUBSCRIPTION=f"projects/{emulators.project}/subscriptions/nope",
        PUBSUB_WORKER_COLLECTION=firestore_collection,
        FIRESTORE_EMULATOR_HOST=f"127.0.0.1:{port}",
    )

    code, document = config_json(capsys)

    assert code == 1
    assert findings(document) == {
        "subscription": "problem",
        "failure topic": "warning",
        "Firestore": "problem",
        "TTL policy": "hint",
        "indexes": "hint",
        "dashboard indexes": "hint",
        "index exemptions": "hint",
    }
    details = {check["check"]: check["detail"] for check in document["checks"]}
    assert details["subscription"] == "does not exist"
    assert details["index exemptions"].startswith("does not apply to the emulator")
    assert details["Firestore"].startswith(
        f"Firestore did not answer: the emulator at 127.0.0.1:{port}"
    )


def test_settings_that_do_not_parse_are_the_one_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PUBSUB_WORKER_LEASE_SECONDS", "3")
    code, document = config_json(capsys)
    assert code == 1
    assert document["settings"] == []
    (check,) = document["checks"]
    assert (check["check"], check["level"]) == ("settings", "problem")
    assert "PUBSUB_WORKER_LEASE_SECONDS" in check["detail"]


def test_config_says_whether_the_subscription_orders_messages(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    make_subscription: Any,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Informational, next to exactly-once delivery: neither state is a problem."""
    plain = make_subscription(exactly_once=True, ack_deadline_seconds=10)
    topic = topic_path(emulators.project, unique_id("ordered"))
    ordered = subscription_path(emulators.project, unique_id("ordered-sub"))
    publisher.create_topic(request={"name": topic})
    subscriber.create_subscription(
        request={
            "name": ordered,
            "topic": topic,
            "ack_deadline_seconds": 10,
            "enable_exactly_once_delivery": True,
            "enable_message_ordering": True,
        }
    )
    seen = {}
    try:
        for path in (ordered, plain.subscription_path):
            configure(
                monkeypatch,
                emulators,
                PUBSUB_WORKER_SUBSCRIPTION=path,
                PUBSUB_WORKER_COLLECTION=firestore_collection,
                PUBSUB_WORKER_LEASE_SECONDS="10",
            )
            code, document = config_json(capsys)
            names = [check["check"] for check in document["checks"]]
            ordering = document["checks"][names.index("exactly-once delivery") + 1]
            capsys.readouterr()
            assert main(["config"]) == code
            lines = capsys.readouterr().out.splitlines()
            after = lines[lines.index("  OK       exactly-once delivery: on") + 1]
            seen[path] = (code, document["problems"], ordering, after)
    finally:
        subscriber.delete_subscription(request={"subscription": ordered})
        publisher.delete_topic(request={"topic": topic})

    on = (
        "on: messages that share an ordering key are delivered in publish order, and the "
        "client hands the next one of a key to the worker only once the previous one was "
        "acked or nacked"
    )
    off = "off: messages are delivered in any order"
    assert seen == {
        ordered: (
            0,
            0,
            {"check": "message ordering", "level": "ok", "detail": on},
            f"  OK       message ordering: {on}",
        ),
        plain.subscription_path: (
            0,
            0,
            {"check": "message ordering", "level": "ok", "detail": off},
            f"  OK       message ordering: {off}",
        ),
    }
