"""``pubsub-worker config``'s findings for a push subscription (pure: a subscription as read)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from google.pubsub_v1.types import Subscription

from pubsub_worker._ops.push_check import Finding, is_push, push_findings
from pubsub_worker.settings import Settings

SUB = "projects/orders-demo/subscriptions/orders-push"
ENDPOINT = "https://orders-push-abc123-ew.a.run.app/"
ACCOUNT = "push-invoker@orders-demo.iam.gserviceaccount.com"


def subscription(**push: Any) -> Any:
    config: dict[str, Any] = {"push_endpoint": ENDPOINT, **push}
    return Subscription(
        name=SUB,
        topic="projects/orders-demo/topics/orders",
        ack_deadline_seconds=60,
        push_config=config,
    )


def settings(**values: Any) -> Settings:
    base: dict[str, Any] = {
        "subscription": SUB,
        "lease_seconds": 60,
        # Real Pub/Sub unless a test says otherwise, whatever the environment running it says.
        "pubsub_emulator_host": None,
        "firestore_emulator_host": None,
    }
    return Settings(**{**base, **values})


def by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.name: finding for finding in findings}


def test_a_push_subscription_is_told_apart() -> None:
    assert is_push(subscription())
    assert not is_push(Subscription(name=SUB, topic="projects/orders-demo/topics/orders"))


def test_matching_authentication_is_ok() -> None:
    found = by_name(
        push_findings(
            settings(push_audience=ENDPOINT, push_service_account=ACCOUNT),
            subscription(oidc_token={"service_account_email": ACCOUNT}),
        )
    )
    assert found["authentication"].level == "ok"
    assert ACCOUNT in found["authentication"].detail
    assert found["ack deadline"].level == "ok"
    assert "each request may run 50 s" in found["ack deadline"].detail
    assert found["exactly-once delivery"].level == "ok"
    assert [f.level for f in found.values()].count("problem") == 0


def test_an_explicit_token_audience_is_the_one_expected() -> None:
    sub = subscription(oidc_token={"service_account_email": ACCOUNT, "audience": "orders"})
    ok = settings(push_audience="orders", push_service_account=ACCOUNT)
    assert by_name(push_findings(ok, sub))["authentication"].level == "ok"
    wrong = settings(push_audience=ENDPOINT, push_service_account=ACCOUNT)
    found = by_name(push_findings(wrong, sub))["token audience"]
    assert (found.level, "refused 401" in found.detail) == ("problem", True)


def test_another_service_account_is_a_problem() -> None:
    sub = subscription(oidc_token={"service_account_email": ACCOUNT})
    other_account = "other@orders-demo.iam.gserviceaccount.com"
    other = settings(push_audience=ENDPOINT, push_service_account=other_account)
    found = by_name(push_findings(other, sub))["authentication"]
    assert found.level == "problem"
    assert "403" in found.detail


def test_unset_expectations_while_verifying_are_a_problem() -> None:
    sub = subscription(oidc_token={"service_account_email": ACCOUNT})
    found = push_findings(settings(), sub)
    levels = [f.level for f in found if f.name in ("authentication", "token audience")]
    assert levels == ["problem", "problem"]


def test_no_token_while_verifying_is_a_problem_with_the_fix() -> None:
    found = by_name(push_findings(settings(), subscription()))["authentication"]
    assert found.level == "problem"
    assert "--push-auth-service-account" in found.detail


EMULATORS = {"pubsub_emulator_host": "127.0.0.1:8085", "firestore_emulator_host": "127.0.0.1:8086"}


def test_no_token_on_the_emulator_says_to_turn_verification_off() -> None:
    emulator = settings(**EMULATORS)
    found = by_name(push_findings(emulator, subscription()))["authentication"]
    assert found.level == "problem"
    assert "PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false" in found.detail
    off = settings(**EMULATORS, push_verify_token=False)
    assert by_name(push_findings(off, subscription()))["authentication"].level == "ok"


@pytest.mark.parametrize(
    "where",
    [{}, {"pubsub_emulator_host": "127.0.0.1:8085"}],
    ids=["Google", "the Pub/Sub emulator alone"],
)
@pytest.mark.parametrize("token", [False, True], ids=["no token sent", "a token sent"])
def test_verification_off_off_the_emulators_is_a_problem_the_endpoint_does_not_start(
    where: dict[str, str], token: bool
) -> None:
    sub = subscription(oidc_token={"service_account_email": ACCOUNT}) if token else subscription()
    found = by_name(push_findings(settings(push_verify_token=False, **where), sub))
    assert found["authentication"].level == "problem"
    assert "the endpoint does not start" in found["authentication"].detail
    assert "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED=true" in found["authentication"].detail


def test_no_token_and_no_check_behind_another_authentication_is_a_warning() -> None:
    allowed = settings(push_verify_token=False, push_allow_unverified=True)
    found = by_name(push_findings(allowed, subscription()))
    assert found["authentication"].level == "warning"
    assert "anyone who can reach the endpoint" in found["authentication"].detail


def test_a_token_not_checked_behind_another_authentication_is_a_warning() -> None:
    sub = subscription(oidc_token={"service_account_email": ACCOUNT})
    allowed = settings(push_verify_token=False, push_allow_unverified=True)
    found = by_name(push_findings(allowed, sub))["authentication"]
    assert found.level == "warning"
    assert f"PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT={ACCOUNT}" in found.detail


UNWRAPPED = {"no_wrapper": {"write_metadata": True}}
UNWRAPPED_BARE = {"no_wrapper": {"write_metadata": False}}


def key_finding(key_attribute: str | None, **push: Any) -> Finding:
    return by_name(push_findings(settings(key_attribute=key_attribute), subscription(**push)))[
        "key attribute"
    ]


def test_a_key_attribute_unwrapped_without_metadata_never_arrives_a_problem() -> None:
    found = key_finding("orderId", **UNWRAPPED_BARE)
    assert found.level == "problem"
    assert "no attribute reaches the endpoint" in found.detail
    assert "--push-no-wrapper-write-metadata" in found.detail
    assert "PUBSUB_WORKER_KEY_ATTRIBUTE=orderId" in found.detail


def test_an_upper_case_key_attribute_unwrapped_is_a_warning_that_says_how_it_arrives() -> None:
    found = key_finding("orderId", **UNWRAPPED)
    assert found.level == "warning"
    assert "arrives unwrapped as the header orderid" in found.detail
    assert "matched case-insensitively" in found.detail


@pytest.mark.parametrize("name", ["Content-Type", "traceparent", "X-Forwarded-For", "ce-id"])
def test_a_key_attribute_named_like_a_transport_header_unwrapped_is_a_problem(name: str) -> None:
    found = key_finding(name, **UNWRAPPED)
    assert found.level == "problem"
    assert "belongs to the HTTP transport" in found.detail


def test_a_key_attribute_that_arrives_as_set_is_ok() -> None:
    assert key_finding("order_id", **UNWRAPPED).level == "ok"  # lowercase: the same header
    assert key_finding("orderId").level == "ok"  # wrapped: names as published
    assert (
        key_finding("orderId").detail == "orderId, read from the envelope's attributes as published"
    )
    assert key_finding(None, **UNWRAPPED_BARE).level == "ok"  # the message id is the key


def test_unwrapped_without_metadata_is_a_problem() -> None:
    sub = subscription(no_wrapper={"write_metadata": False})
    assert by_name(push_findings(settings(), sub))["payload"].level == "problem"
    sub = subscription(no_wrapper={"write_metadata": True})
    assert by_name(push_findings(settings(), sub))["payload"].level == "ok"


@pytest.mark.parametrize(("deadline", "level"), [(60, "ok"), (30, "warning"), (10, "warning")])
def test_the_ack_deadline_is_the_lease(deadline: int, level: str) -> None:
    sub = subscription()
    sub.ack_deadline_seconds = deadline
    lease = 60 if deadline != 10 else 10
    found = by_name(push_findings(settings(lease_seconds=lease), sub))["ack deadline"]
    assert found.level == level


def test_a_path_other_than_root_is_named() -> None:
    sub = subscription()
    sub.push_config.push_endpoint = "https://orders.example/pubsub/"
    assert "/pubsub/ must be where the app is mounted" in push_findings(settings(), sub)[0].detail


def test_retry_and_dead_letter_policies() -> None:
    sub = subscription()
    found = by_name(push_findings(settings(), sub))
    assert (found["retry policy"].level, found["dead-letter policy"].level) == ("hint", "hint")
    sub.retry_policy = {
        "minimum_backoff": datetime.timedelta(seconds=10),
        "maximum_backoff": datetime.timedelta(seconds=600),
    }
    sub.dead_letter_policy = {
        "dead_letter_topic": "projects/orders-demo/topics/orders-dead",
        "max_delivery_attempts": 5,
    }
    found = by_name(push_findings(settings(), sub))
    assert found["retry policy"].level == "ok"
    assert "10 s to 600 s" in found["retry policy"].detail
    assert found["dead-letter policy"].level == "warning"  # 5 <= MAX_ATTEMPTS (5)
    sub.dead_letter_policy.max_delivery_attempts = 20
    assert by_name(push_findings(settings(), sub))["dead-letter policy"].level == "ok"
