"""Where a replay goes: to the job's own subscription only, unless fan-out is asked for.

A replayed message published to the subscription's topic reaches every
subscription of that topic: a sibling consumer (another team's, or one that
is not wrapped) would run it again. So replays go to a **replay topic** of
the subscription's own, ``<SUBSCRIPTION ID>-replay``, whose one subscription
(``<SUBSCRIPTION ID>-replay`` too) the same worker consumes beside its own
(:func:`pubsub_worker.run` does; a push endpoint gets it as a push
subscription to the same endpoint). Its jobs are recorded under the home
subscription, so a replayed job resumes after its recorded steps.

:func:`setup` makes both (``pubsub-worker jobs replay-setup``), copying what
matters of the home subscription (exactly-once delivery, ack deadline, push
endpoint and token, retry policy). :func:`route` says where a replay goes:
the replay topic when its subscription exists, else a :class:`ConfigError`
naming the fix, unless fan-out to the home topic is asked for by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings

__all__ = ["Route", "explain", "route", "setup"]

_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Route:
    """Where replays are published and which subscriptions they reach."""

    topic: str
    reaches: tuple[str, ...]
    fan_out: bool

    def describe(self) -> str:
        """``to TOPIC (reaches only S)`` or ``to TOPIC (fans out to N subscriptions: ...)``."""
        if not self.fan_out:
            return f"to {self.topic} (reaches only {self.reaches[0]})"
        names = ", ".join(r.rsplit("/", 1)[-1] for r in self.reaches)
        return f"to {self.topic} (fans out to {len(self.reaches)} subscription(s): {names})"


def _subscriptions_of(publisher: Any, topic: str) -> tuple[str, ...]:
    found = publisher.list_topic_subscriptions(request={"topic": topic}, timeout=_TIMEOUT_S)
    return tuple(sorted(found))


def _exists(subscriber: Any, subscription: str) -> bool:
    try:
        subscriber.get_subscription(request={"subscription": subscription}, timeout=_TIMEOUT_S)
    except gexc.NotFound:
        return False
    return True


def route(settings: Settings, *, subscriber: Any, publisher: Any, fan_out: bool) -> Route:
    """Where a replay of this subscription's failed jobs goes.

    Without ``fan_out``: the replay topic, which only the replay subscription
    (consumed by this subscription's worker) reads; ``ConfigError`` when it is
    not set up. With ``fan_out``: the home subscription's topic, read by every
    subscription of it.
    """
    home = settings.subscription_path
    if fan_out:
        topic = subscriber.get_subscription(
            request={"subscription": home}, timeout=_TIMEOUT_S
        ).topic
        return Route(str(topic), _subscriptions_of(publisher, topic), fan_out=True)
    if not _exists(subscriber, settings.replay_subscription_path):
        raise ConfigError(
            f"no replay subscription {settings.replay_subscription_path}: a replay would have "
            f"nowhere to go but {home}'s topic, which every sibling subscription reads. "
            "Make it once with `pubsub-worker jobs replay-setup` (the worker then consumes "
            "it beside its own), or pass --fan-out to publish to the topic for every "
            "subscription of it"
        )
    return Route(settings.replay_topic_path, (settings.replay_subscription_path,), fan_out=False)


def explain(settings: Settings, *, subscriber: Any, publisher: Any) -> tuple[bool, str]:
    """For ``config``: whether replay reaches only this subscription, and how it is set up."""
    try:
        return True, "replays go " + route(
            settings, subscriber=subscriber, publisher=publisher, fan_out=False
        ).describe()
    except ConfigError:
        fan = route(settings, subscriber=subscriber, publisher=publisher, fan_out=True)
        return False, (
            f"no replay subscription ({settings.replay_subscription_path}): `jobs replay` "
            f"refuses, and with --fan-out it would go {fan.describe()}; run "
            "`pubsub-worker jobs replay-setup`"
        )


def setup(settings: Settings, *, subscriber: Any, publisher: Any) -> list[str]:
    """Make the replay topic and subscription (idempotent); what was made, in order.

    The subscription copies the home one's exactly-once delivery, ack
    deadline, push endpoint (with its OIDC token and no-wrapper settings) and
    retry policy, and has no filter and no dead-letter policy.
    """
    home = subscriber.get_subscription(
        request={"subscription": settings.subscription_path}, timeout=_TIMEOUT_S
    )
    made: list[str] = []
    topic = settings.replay_topic_path
    try:
        publisher.create_topic(request={"name": topic}, timeout=_TIMEOUT_S)
        made.append(topic)
    except gexc.AlreadyExists:
        pass
    request: dict[str, Any] = {
        "name": settings.replay_subscription_path,
        "topic": topic,
        "ack_deadline_seconds": home.ack_deadline_seconds,
        "enable_exactly_once_delivery": home.enable_exactly_once_delivery,
    }
    if home.push_config.push_endpoint:
        request["push_config"] = home.push_config
    if home.retry_policy:
        request["retry_policy"] = home.retry_policy
    try:
        subscriber.create_subscription(request=request, timeout=_TIMEOUT_S)
        made.append(settings.replay_subscription_path)
    except gexc.AlreadyExists:
        pass
    return made
