"""``pubsub-worker config``: the effective configuration, checked against what it names.

:func:`run_checks` asks Pub/Sub and Firestore, once each, whether the
worker would run as configured (the settings themselves, with secrets
masked and where each came from, are :mod:`pubsub_worker._ops.config_report`):

=====================  ===============================================================
check                  a problem (exit 1) when
=====================  ===============================================================
subscription           it does not exist, is a push subscription, or its topic was
                       deleted
exactly-once delivery  it is off and ``ALLOW_AT_LEAST_ONCE`` is not set (a warning if set)
message ordering       never: says whether it is on (``enable_message_ordering``)
ack deadline           never: a warning when it differs from ``LEASE_SECONDS``
retry policy           never: a hint when absent
dead-letter policy     its topic does not exist; a warning when Pub/Sub could dead-letter
                       a message before the worker's own failure path (``MAX_ATTEMPTS``)
failure topic          ``FAILURE_TOPIC`` is set and the topic does not exist (a warning
                       when unset)
Firestore              it does not answer
TTL policy, indexes    never: hints with the ``gcloud`` commands (checked through the
                       Firestore Admin API on real Firestore, where permitted)
dashboard indexes      never: a hint with the command of ``pubsub-worker ui``'s index
index exemptions       never: on real Firestore, a hint with its ``gcloud`` command per
                       field of ``EXEMPT_FIELDS`` still indexed (``ListFields``, the
                       explicit overrides); on the emulator, that it does not apply
=====================  ===============================================================

The pure part (:func:`subscription_checks`) judges a subscription as read;
the rest is I/O with short timeouts. Nothing here writes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_worker._support import clients
from pubsub_worker.errors import ConfigError, Unreachable
from pubsub_worker.settings import Settings
from pubsub_worker.stores.layout import ttl_command

from . import replay_route
from .findings import Check, Level
from .firestore_check import firestore_answers, firestore_setup
from .push_check import is_push, push_findings

__all__ = [
    "Check",
    "Level",
    "run_checks",
    "subscription_checks",
    "ttl_command",
]

_TIMEOUT_S = 10.0


# -- the subscription, as read ------------------------------------------------------


def subscription_checks(settings: Settings, subscription: Any) -> list[Check]:
    """Judge a subscription (a ``google.pubsub_v1.types.Subscription``) against settings. Pure."""
    if is_push(subscription):  # served by `pubsub-worker push`: its own checks
        return [
            Check(f.name, Level(f.level), f.detail) for f in push_findings(settings, subscription)
        ]
    checks = []
    pb = type(subscription).pb(subscription)
    if subscription.topic == "_deleted-topic_":
        checks.append(
            Check("subscription", Level.PROBLEM, "its topic was deleted: nothing will arrive")
        )
    else:
        checks.append(Check("subscription", Level.OK, f"exists, on {subscription.topic}"))
    checks.append(_exactly_once(settings, bool(subscription.enable_exactly_once_delivery)))
    checks.append(_ordering(bool(subscription.enable_message_ordering)))
    checks.append(_ack_deadline(settings, int(subscription.ack_deadline_seconds)))
    if pb.HasField("retry_policy"):
        policy = subscription.retry_policy
        checks.append(
            Check(
                "retry policy",
                Level.OK,
                f"redeliveries back off from {_seconds(policy.minimum_backoff)} "
                f"to {_seconds(policy.maximum_backoff)}",
            )
        )
    else:
        checks.append(
            Check(
                "retry policy",
                Level.HINT,
                "none: a nacked message (a busy key, a released job) comes back at once; "
                "a retry policy spaces redeliveries out: gcloud pubsub subscriptions update "
                f"{_short(settings.subscription_path)} --min-retry-delay=10s "
                "--max-retry-delay=600s",
            )
        )
    checks.append(_dead_letter(settings, subscription, pb.HasField("dead_letter_policy")))
    return checks


def _exactly_once(settings: Settings, enabled: bool) -> Check:
    if enabled:
        return Check("exactly-once delivery", Level.OK, "on")
    fix = (
        f"gcloud pubsub subscriptions update {_short(settings.subscription_path)} "
        "--enable-exactly-once-delivery"
    )
    if settings.allow_at_least_once:
        return Check(
            "exactly-once delivery",
            Level.WARNING,
            "off, accepted by PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE: acks prove nothing and only the "
            f"Firestore epoch fences stale workers; to turn it on: {fix}",
        )
    return Check(
        "exactly-once delivery",
        Level.PROBLEM,
        f"off: the worker refuses to start (a stale ack would look like a real one); {fix}, "
        "or set PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE=true",
    )


def _ordering(enabled: bool) -> Check:
    """Whether the subscription orders messages by ordering key: informational either way."""
    if enabled:
        return Check(
            "message ordering",
            Level.OK,
            "on: messages that share an ordering key are delivered in publish order, and the "
            "client hands the next one of a key to the worker only once the previous one was "
            "acked or nacked",
        )
    return Check("message ordering", Level.OK, "off: messages are delivered in any order")


def _ack_deadline(settings: Settings, deadline_s: int) -> Check:
    lease_s = settings.lease_seconds
    name = "ack deadline"
    if deadline_s == lease_s:
        return Check(name, Level.OK, f"{deadline_s} s, the same as PUBSUB_WORKER_LEASE_SECONDS")
    fix = (
        f"gcloud pubsub subscriptions update {_short(settings.subscription_path)} "
        f"--ack-deadline={lease_s}"
    )
    if deadline_s < lease_s:
        why = (
            "a message whose first lease extension is late (a busy client) can be redelivered "
            "while a worker holds it, and that delivery then waits for the owner's lease"
        )
    else:
        why = (
            "a message whose worker died before extending its lease comes back only after "
            f"{deadline_s} s instead of {lease_s} s"
        )
    return Check(
        name,
        Level.WARNING,
        f"{deadline_s} s, PUBSUB_WORKER_LEASE_SECONDS is {lease_s} s (run() extends each "
        f"lease by LEASE_SECONDS): {why}; {fix}",
    )


def _dead_letter(settings: Settings, subscription: Any, present: bool) -> Check:
    if not present or not subscription.dead_letter_policy.dead_letter_topic:
        return Check(
            "dead-letter policy",
            Level.OK,
            "none: the worker's failure path records and publishes failed jobs itself",
        )
    policy = subscription.dead_letter_policy
    attempts = int(policy.max_delivery_attempts) or 5
    detail = f"to {policy.dead_letter_topic} after {attempts} delivery attempts"
    if attempts <= settings.max_attempts:
        return Check(
            "dead-letter policy",
            Level.WARNING,
            f"{detail}, not more than PUBSUB_WORKER_MAX_ATTEMPTS ({settings.max_attempts}): "
            "Pub/Sub may dead-letter a message before the worker's failure path records it "
            "(a delivery that waits for a busy owner counts too), and `jobs replay` cannot "
            "revive a message it never recorded; raise --max-delivery-attempts above "
            "MAX_ATTEMPTS",
        )
    return Check("dead-letter policy", Level.OK, detail + ", after the worker's own failure path")


def _seconds(duration: Any) -> str:
    if duration is None:
        return "?"
    if hasattr(duration, "total_seconds"):
        return f"{duration.total_seconds():.0f} s"
    return f"{getattr(duration, 'seconds', 0)} s"


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


# -- everything, live ---------------------------------------------------------------


def run_checks(
    settings: Settings,
    *,
    subscriber: Any,
    publisher: Any,
    firestore_client: Any,
    admin: Callable[[], Any] | None = None,
) -> list[Check]:
    """Every check, in the order of the module docstring. Never raises for a finding.

    ``admin`` makes a Firestore Admin API client for the TTL and index
    checks on real Firestore (None: hints only, as on the emulator).
    """
    checks: list[Check] = []
    try:
        settings.subscription_path  # noqa: B018 - raises ConfigError when unset
    except ConfigError as exc:
        return [Check("subscription", Level.PROBLEM, str(exc))]
    # Read as the worker reads it at start-up (clients.read_subscription): once, same errors.
    subscription = _read(lambda: clients.read_subscription(subscriber, settings))
    if isinstance(subscription, Check):
        checks.append(Check("subscription", subscription.level, subscription.detail))
    else:
        checks.extend(subscription_checks(settings, subscription))
        topic = subscription.topic
        if topic and topic != "_deleted-topic_":
            checks.append(_topic_exists("subscription's topic", topic, publisher))
        dead_letter = subscription.dead_letter_policy.dead_letter_topic
        if dead_letter:
            checks.append(_topic_exists("dead-letter topic", dead_letter, publisher))
        checks.append(_replay(settings, subscriber, publisher))
    checks.append(_failure_topic(settings, publisher))
    checks.append(firestore_answers(settings, firestore_client))
    checks.extend(firestore_setup(settings, admin))
    return checks


def _read(call: Callable[[], Any]) -> Any:
    """The call's answer, or a PROBLEM check saying why there is none."""
    try:
        return call()
    except (gexc.NotFound, ConfigError):  # ConfigError: read_subscription's NotFound
        return Check("", Level.PROBLEM, "does not exist")
    except Unreachable as exc:
        return Check("", Level.PROBLEM, str(exc))
    except gexc.PermissionDenied as exc:
        return Check("", Level.PROBLEM, f"permission denied: {exc.message}")
    except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
        return Check("", Level.PROBLEM, f"Pub/Sub did not answer: {exc}")


def _topic_exists(name: str, topic: str, publisher: Any) -> Check:
    found = _read(lambda: publisher.get_topic(request={"topic": topic}, timeout=_TIMEOUT_S))
    if isinstance(found, Check):
        return Check(name, found.level, f"{topic} {found.detail}")
    return Check(name, Level.OK, f"{topic} exists")


def _replay(settings: Settings, subscriber: Any, publisher: Any) -> Check:
    """How replay is set up: only to this subscription (ok), or it would fan out (warning)."""
    found = _read(
        lambda: replay_route.explain(settings, subscriber=subscriber, publisher=publisher)
    )
    if isinstance(found, Check):
        return Check("replay", Level.WARNING, f"cannot tell: {found.detail}")
    only, detail = found
    return Check("replay", Level.OK if only else Level.WARNING, detail)


def _failure_topic(settings: Settings, publisher: Any) -> Check:
    name = "failure topic"
    topic = settings.failure_topic_path
    if topic is None:
        return Check(
            name,
            Level.WARNING,
            "PUBSUB_WORKER_FAILURE_TOPIC is not set: failed jobs are kept only in their "
            "Firestore record (replayable with `jobs replay`), and a message too large to "
            "keep there stays unacked",
        )
    found = _topic_exists(name, topic, publisher)
    if found.level is Level.PROBLEM and found.detail.endswith("does not exist"):
        return Check(
            name,
            Level.PROBLEM,
            f"{topic} does not exist: the worker refuses to start; create it "
            f"(gcloud pubsub topics create {_short(topic)}) or unset PUBSUB_WORKER_FAILURE_TOPIC",
        )
    return found
