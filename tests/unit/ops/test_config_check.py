"""The pure parts of ``pubsub-worker config``: a subscription as read, masks, platform defaults."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from google.pubsub_v1.types import DeadLetterPolicy, PushConfig, RetryPolicy, Subscription

from pubsub_worker import Settings
from pubsub_worker._ops import config_check as cc
from pubsub_worker._ops import config_report as cr
from pubsub_worker._ops.push_check import push_findings

SUB = "projects/proj/subscriptions/sub"


def settings(**values: Any) -> Settings:
    return Settings(subscription=SUB, lease_seconds=60, **values)


def levels(checks: list[cc.Check]) -> dict[str, cc.Level]:
    return {check.name: check.level for check in checks}


def test_a_subscription_made_for_the_worker_has_no_findings() -> None:
    subscription = Subscription(
        name=SUB,
        topic="projects/proj/topics/t",
        enable_exactly_once_delivery=True,
        ack_deadline_seconds=60,
        retry_policy=RetryPolicy(
            minimum_backoff=timedelta(seconds=10), maximum_backoff=timedelta(seconds=600)
        ),
        dead_letter_policy=DeadLetterPolicy(
            dead_letter_topic="projects/proj/topics/dead", max_delivery_attempts=20
        ),
    )
    checks = cc.subscription_checks(settings(), subscription)
    assert levels(checks) == {
        "subscription": cc.Level.OK,
        "exactly-once delivery": cc.Level.OK,
        "message ordering": cc.Level.OK,
        "ack deadline": cc.Level.OK,
        "retry policy": cc.Level.OK,
        "dead-letter policy": cc.Level.OK,
    }
    assert "from 10 s to 600 s" in next(c.detail for c in checks if c.name == "retry policy")


def test_each_misfit_of_a_subscription_is_named_with_its_fix() -> None:
    subscription = Subscription(
        name=SUB,
        topic="projects/proj/topics/t",
        enable_exactly_once_delivery=False,
        ack_deadline_seconds=10,
        dead_letter_policy=DeadLetterPolicy(
            dead_letter_topic="projects/proj/topics/dead", max_delivery_attempts=5
        ),
    )
    checks = {c.name: c for c in cc.subscription_checks(settings(), subscription)}
    assert checks["exactly-once delivery"].level is cc.Level.PROBLEM
    assert "--enable-exactly-once-delivery" in checks["exactly-once delivery"].detail
    assert checks["ack deadline"].level is cc.Level.WARNING
    assert "--ack-deadline=60" in checks["ack deadline"].detail
    assert checks["retry policy"].level is cc.Level.HINT
    assert checks["dead-letter policy"].level is cc.Level.WARNING
    assert "MAX_ATTEMPTS (5)" in checks["dead-letter policy"].detail

    allowed = cc.subscription_checks(settings(allow_at_least_once=True), subscription)
    assert levels(allowed)["exactly-once delivery"] is cc.Level.WARNING


@pytest.mark.parametrize(("enabled", "said"), [(True, "on: "), (False, "off: ")])
def test_message_ordering_is_reported_next_to_exactly_once_and_is_never_a_finding(
    enabled: bool, said: str
) -> None:
    subscription = Subscription(
        name=SUB, topic="projects/proj/topics/t", enable_message_ordering=enabled
    )
    checks = cc.subscription_checks(settings(allow_at_least_once=True), subscription)
    names = [check.name for check in checks]
    assert names[1:3] == ["exactly-once delivery", "message ordering"]
    ordering = checks[2]
    assert (ordering.level, ordering.detail.startswith(said)) == (cc.Level.OK, True)


def test_a_subscription_whose_topic_was_deleted_is_a_problem() -> None:
    check = cc.subscription_checks(settings(), Subscription(topic="_deleted-topic_"))[0]
    assert (check.level, "deleted" in check.detail) == (cc.Level.PROBLEM, True)


def test_a_push_subscription_is_judged_as_the_push_endpoint_serves_it() -> None:
    subscription = Subscription(
        name=SUB, topic="t", push_config=PushConfig(push_endpoint="https://x.example/")
    )
    checks = cc.subscription_checks(settings(), subscription)
    expected = push_findings(settings(), subscription)
    assert [(c.name, c.level.value, c.detail) for c in checks] == [tuple(f) for f in expected]
    assert [c.name for c in checks][:2] == ["subscription", "payload"]  # not a pull's checks


def test_secrets_and_url_passwords_are_masked() -> None:
    assert cr.mask("API_TOKEN", "abc") == "********"
    assert cr.mask("DB_PASSWORD", "hunter2") == "********"
    assert cr.mask("PUBSUB_WORKER_SUBSCRIPTION", SUB) == SUB
    assert cr.mask("proxy", "https://user:hunter2@example.com/x") == (
        "https://user:********@example.com/x"
    )
    assert cr.mask("anything", None) == "(unset)"
    assert cr.mask("PUBSUB_WORKER_PUSH_VERIFY_TOKEN", True) == "True"  # a switch


def test_effective_settings_say_where_each_value_came_from() -> None:
    environ = {"PUBSUB_WORKER_SUBSCRIPTION": SUB, "CLOUD_RUN_WORKER_POOL": "pool"}
    overrides = cr.platform_overrides(environ)
    assert overrides == {"shutdown_grace_seconds": cr.CLOUD_RUN_GRACE_S}
    rows = {
        row.variable: row
        for row in cr.effective_settings(Settings(subscription=SUB, **overrides), environ)
    }
    assert rows["PUBSUB_WORKER_SUBSCRIPTION"].source == "environment"
    assert rows["PUBSUB_WORKER_LEASE_SECONDS"].source == "default"
    grace = rows["PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS"]
    assert (grace.value, grace.source) == ("5.0", "CLOUD_RUN_WORKER_POOL default")
    assert rows["PUBSUB_WORKER_FAILURE_TOPIC"].value == "(unset)"
    assert rows["subscription path"].value == SUB


def test_a_set_grace_wins_over_cloud_runs_default_and_elsewhere_there_is_none() -> None:
    assert cr.platform_overrides({"K_SERVICE": "svc"}) == {"shutdown_grace_seconds": 5.0}
    set_by_hand = {"K_SERVICE": "svc", "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "8"}
    assert cr.platform_overrides(set_by_hand) == {}
    assert cr.platform_overrides({}) == {}
