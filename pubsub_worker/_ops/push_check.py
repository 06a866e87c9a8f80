"""``pubsub-worker config`` for a push subscription: its endpoint and authentication.

:func:`push_findings` judges a push subscription as read (pure, no I/O)
against the settings a ``pubsub-worker push`` endpoint runs with:

===================  ==================================================================
finding              a problem (exit 1) when
===================  ==================================================================
subscription         never: says where it pushes (and that the path must be the one the
                     endpoint serves: ``POST /``, or a mounted app's prefix)
payload              unwrapped without ``write_metadata``: no message id reaches the
                     endpoint, every request is answered 400
key attribute        ``KEY_ATTRIBUTE`` can never arrive: unwrapped without
                     ``write_metadata`` (no attribute is sent), or named like a header
                     of the transport (left out); a warning when unwrapped and it has
                     upper-case letters (the header arrives lower-cased and is matched
                     case-insensitively; the other attributes stay lower-cased)
exactly-once         never: push has none; the Firestore epoch is the whole protection
ack deadline         never: a warning when it differs from ``LEASE_SECONDS`` (the push
                     request timeout sizes the job's lease and its cap), or is too short
                     for a request that polls a busy job
authentication       the subscription sends no token but ``PUSH_VERIFY_TOKEN`` is on, or its
                     service account or audience is not the one the endpoint expects
                     (every request would be refused 401/403), or they are unset; or
                     verification is off off the emulators without
                     ``PUSH_ALLOW_UNVERIFIED`` (the endpoint does not start); a warning
                     when it is off with ``PUSH_ALLOW_UNVERIFIED``
retry policy         never: a hint when absent (refused requests come back at once)
dead-letter policy   never: a hint when absent (a request the endpoint can never accept is
                     retried until the message expires); a warning when Pub/Sub could
                     dead-letter before the worker's failure path (``MAX_ATTEMPTS``)
===================  ==================================================================

A finding is a :class:`Finding` (name, level, detail), the level one of
``config_check.Level``'s values, so that ``config_check`` (which imports
this module, not the other way round) turns each into its ``Check``.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlsplit

from pubsub_worker._variables import env_name
from pubsub_worker.push.delivery import request_cap_s
from pubsub_worker.push.envelope import is_transport_header
from pubsub_worker.settings import Settings

__all__ = ["Finding", "is_push", "push_findings"]

_BUSY_POLL_S = 10
"""How long a request polls a job another owner holds before it answers 503."""


class Finding(NamedTuple):
    """One finding: ``level`` is ``ok``, ``problem``, ``warning`` or ``hint``."""

    name: str
    level: str
    detail: str


def is_push(subscription: Any) -> bool:
    """Whether the subscription (a ``google.pubsub_v1.types.Subscription``) pushes."""
    return bool(subscription.push_config.push_endpoint)


def push_findings(settings: Settings, subscription: Any) -> list[Finding]:
    """Judge a push subscription against the settings of its endpoint. Pure."""
    pb = type(subscription).pb(subscription)
    push = subscription.push_config
    short = settings.subscription_path.rsplit("/", 1)[-1]
    found = [_endpoint(push.push_endpoint, subscription.topic)]
    unwrapped = pb.push_config.HasField("no_wrapper")
    found.append(_payload(unwrapped, push, short))
    found.append(_key_attribute(settings, unwrapped, push, short))
    found.append(
        Finding(
            "exactly-once delivery",
            "ok",
            "not available for push: every request is fenced by the job document's epoch "
            "alone (a duplicate request is answered from the record or refused)",
        )
    )
    found.append(_deadline(settings, int(subscription.ack_deadline_seconds), short))
    found.extend(_authentication(settings, pb.push_config.HasField("oidc_token"), push, short))
    found.append(_retry(pb.HasField("retry_policy"), subscription, short))
    found.append(_dead_letter(settings, subscription, pb.HasField("dead_letter_policy"), short))
    return found


def _endpoint(endpoint: str, topic: str) -> Finding:
    if topic == "_deleted-topic_":
        return Finding("subscription", "problem", "its topic was deleted: nothing will arrive")
    path = urlsplit(endpoint).path or "/"
    detail = f"a push subscription on {topic}, to {endpoint}"
    if path != "/":
        detail += (
            f" (pubsub-worker push serves POST /: the path {path} must be where the app is mounted)"
        )
    return Finding("subscription", "ok", detail)


def _payload(unwrapped: bool, push: Any, short: str) -> Finding:
    if not unwrapped:
        return Finding("payload", "ok", "wrapped: Pub/Sub's JSON envelope")
    if push.no_wrapper.write_metadata:
        return Finding(
            "payload",
            "ok",
            "unwrapped, with the metadata and attributes as headers (attribute names arrive "
            "lower-cased)",
        )
    return Finding(
        "payload",
        "problem",
        "unwrapped without metadata: no message id reaches the endpoint, so every request "
        f"is answered 400; gcloud pubsub subscriptions update {short} --push-no-wrapper "
        "--push-no-wrapper-write-metadata (or drop --push-no-wrapper)",
    )


def _key_attribute(settings: Settings, unwrapped: bool, push: Any, short: str) -> Finding:
    name, variable = settings.key_attribute, env_name("key_attribute")
    if name is None:
        return Finding("key attribute", "ok", "unset: each message's id is its job's key")
    if not unwrapped:
        return Finding(
            "key attribute", "ok", f"{name}, read from the envelope's attributes as published"
        )
    if not push.no_wrapper.write_metadata:
        return Finding(
            "key attribute",
            "problem",
            f"{variable}={name}, but unwrapped without metadata no attribute reaches the "
            "endpoint: no message would have its key; gcloud pubsub subscriptions update "
            f"{short} --push-no-wrapper --push-no-wrapper-write-metadata (or drop "
            "--push-no-wrapper)",
        )
    header = name.lower()
    if is_transport_header(header):
        return Finding(
            "key attribute",
            "problem",
            f"{variable}={name} travels unwrapped as the header {header}, which belongs to "
            "the HTTP transport and is left out of the attributes: every message would go to "
            "review as missing its key; use another attribute, or the wrapped form (drop "
            "--push-no-wrapper)",
        )
    if header != name:
        return Finding(
            "key attribute",
            "warning",
            f"{name} arrives unwrapped as the header {header} (HTTP lower-cases header names) "
            f"and is matched case-insensitively, so the key is found as {name}; the other "
            "attributes reach the handler lower-cased, and attributes that differ only in "
            "case cannot be told apart (the wrapped form keeps names as published)",
        )
    return Finding("key attribute", "ok", f"{name}, as the header {header}")


def _deadline(settings: Settings, deadline_s: int, short: str) -> Finding:
    lease_s = settings.lease_seconds
    name = "ack deadline"
    fix = f"gcloud pubsub subscriptions update {short} --ack-deadline={lease_s}"
    if deadline_s != lease_s:
        return Finding(
            name,
            "warning",
            f"{deadline_s} s (the push request timeout), {env_name('lease_seconds')} is "
            f"{lease_s} s: each request is capped at {request_cap_s(settings)} s from the "
            "lease, so a request may outlive its deadline (sent again while it runs) or stop "
            f"earlier than it must; {fix}",
        )
    if deadline_s < 2 * _BUSY_POLL_S:
        return Finding(
            name,
            "warning",
            f"{deadline_s} s: a request that finds its job busy elsewhere polls for up to "
            f"{_BUSY_POLL_S} s, and each request is capped at {request_cap_s(settings)} s; "
            "60 s or more suits most jobs",
        )
    return Finding(
        name,
        "ok",
        f"{deadline_s} s, the same as {env_name('lease_seconds')}: each request may run "
        f"{request_cap_s(settings)} s",
    )


def _authentication(settings: Settings, has_token: bool, push: Any, short: str) -> list[Finding]:
    name = "authentication"
    verify, allow = env_name("push_verify_token"), env_name("push_allow_unverified")
    account = push.oidc_token.service_account_email if has_token else ""
    audience = push.oidc_token.audience or push.push_endpoint
    unverified = not settings.push_verify_token and not settings.emulated
    if unverified and not settings.push_allow_unverified:
        return [
            Finding(
                name,
                "problem",
                f"{verify}=false off the emulators without {allow}=true: the endpoint does not "
                f"start; check the token ({env_name('push_audience')}={audience}, "
                f"{env_name('push_service_account')}={account or 'SA'}), or set {allow}=true "
                "only behind something else that authenticates every request (Cloud Run's IAM "
                "invoker check)",
            )
        ]
    if not account:
        if settings.push_verify_token:
            hint = (
                f"the emulator sends no token: set {verify}=false"
                if settings.pubsub_emulator_host
                else (
                    f"gcloud pubsub subscriptions update {short} "
                    "--push-auth-service-account=SA@PROJECT.iam.gserviceaccount.com"
                )
            )
            return [
                Finding(
                    name,
                    "problem",
                    f"the subscription sends no OIDC token and {verify} is on: every request "
                    f"would be refused 401; {hint}",
                )
            ]
        if settings.emulated:
            return [Finding(name, "ok", f"off ({verify}=false): the emulator sends no token")]
        return [
            Finding(
                name,
                "warning",
                f"off ({verify}=false, {allow}=true): no token is sent nor checked, so anyone "
                "who can reach the endpoint can submit jobs unless something in front of it "
                "authenticates them; send one (--push-auth-service-account) and check it",
            )
        ]
    if not settings.push_verify_token:
        return [
            Finding(
                name,
                "warning",
                f"the subscription sends a token of {account}, but {verify}=false: it is not "
                "checked (unless the platform checks it, as Cloud Run does for a service that "
                f"requires authentication); set {env_name('push_audience')}={audience} and "
                f"{env_name('push_service_account')}={account}",
            )
        ]
    found = []
    expected_account = settings.push_service_account
    if expected_account != account:
        why = "is not set" if expected_account is None else f"is {expected_account}"
        found.append(
            Finding(
                name,
                "problem",
                f"the subscription's tokens are for {account}, {env_name('push_service_account')}"
                f" {why}: every request would be refused "
                f"{'(the endpoint does not start)' if expected_account is None else '403'}",
            )
        )
    if settings.push_audience != audience:
        why = "is not set" if settings.push_audience is None else f"is {settings.push_audience}"
        found.append(
            Finding(
                "token audience",
                "problem",
                f"the subscription's tokens carry the audience {audience}, "
                f"{env_name('push_audience')} {why}: every request would be refused "
                f"{'(the endpoint does not start)' if settings.push_audience is None else '401'}",
            )
        )
    if not found:
        found.append(
            Finding(
                name, "ok", f"OIDC tokens of {account} for {audience}, checked on every request"
            )
        )
    return found


def _retry(present: bool, subscription: Any, short: str) -> Finding:
    if present:
        policy = subscription.retry_policy
        return Finding(
            "retry policy",
            "ok",
            f"refused requests come back after {_seconds(policy.minimum_backoff)} to "
            f"{_seconds(policy.maximum_backoff)}",
        )
    return Finding(
        "retry policy",
        "hint",
        "none: a request answered 503 (a busy job, the store unavailable) or 500 comes back "
        "at once, slowed only by Pub/Sub's push backoff; gcloud pubsub subscriptions update "
        f"{short} --min-retry-delay=10s --max-retry-delay=600s",
    )


def _dead_letter(settings: Settings, subscription: Any, present: bool, short: str) -> Finding:
    name = "dead-letter policy"
    if not present or not subscription.dead_letter_policy.dead_letter_topic:
        return Finding(
            name,
            "hint",
            "none: failed jobs go to the worker's failure path, but a request the endpoint can "
            "never accept (400: malformed, another subscription) is retried until the message "
            "expires; gcloud pubsub subscriptions update "
            f"{short} --dead-letter-topic=TOPIC --max-delivery-attempts=N (N above "
            f"{env_name('max_attempts')}, counting the 503s of busy jobs too)",
        )
    policy = subscription.dead_letter_policy
    attempts = int(policy.max_delivery_attempts) or 5
    detail = f"to {policy.dead_letter_topic} after {attempts} delivery attempts"
    if attempts <= settings.max_attempts:
        return Finding(
            name,
            "warning",
            f"{detail}, not more than {env_name('max_attempts')} ({settings.max_attempts}): "
            "Pub/Sub may dead-letter a message before the worker's failure path records it "
            "(every 503 answer counts as an attempt too); raise --max-delivery-attempts",
        )
    return Finding(name, "ok", detail + ", after the worker's own failure path")


def _seconds(duration: Any) -> str:
    if hasattr(duration, "total_seconds"):
        return f"{duration.total_seconds():.0f} s"
    return f"{getattr(duration, 'seconds', 0)} s"
