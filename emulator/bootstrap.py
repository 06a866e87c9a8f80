"""Create a :class:`~emulator.topology.Topology` on the Pub/Sub emulator, idempotently.

Missing topics and subscriptions are created; existing ones are left as
they are (``AlreadyExists`` is expected). An existing subscription whose
settings differ from the declaration is logged as a warning, not changed.

The admin clients built here talk to an emulator only: without an explicit
host or ``PUBSUB_EMULATOR_HOST`` the call fails instead of reaching Google.

Per-test helpers: :func:`create_subscription` bootstraps a uniquely named
topic + subscription (:class:`SubscriptionHandle`); :func:`delete_subscription`
removes them again.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc  # type: ignore[import-untyped, unused-ignore]

from emulator.errors import EmulatorError
from emulator.names import subscription_path, topic_path, unique_id
from emulator.topology import (
    DeadLetterSpec,
    PushSpec,
    RetrySpec,
    SubscriptionSpec,
    TopicSpec,
    Topology,
)

if TYPE_CHECKING:
    from google.pubsub_v1 import PublisherClient, SubscriberClient
    from google.pubsub_v1.types import Subscription

__all__ = [
    "Bootstrapped",
    "SubscriptionHandle",
    "bootstrap",
    "create_subscription",
    "delete_subscription",
    "emulator_channel",
    "publisher_admin",
    "set_push",
    "subscriber_admin",
]

logger = logging.getLogger(__name__)

MAX_METADATA_BYTES = 4 * 1024 * 1024
"""gRPC metadata limit for emulator channels.

With exactly-once delivery, a failed ack batch carries one error entry per
ack id in its trailer; the default 8 KiB limit breaks the Python client from
about 80 invalid ids in one request.
"""


def emulator_channel(host: str) -> grpc.Channel:
    """Return an insecure gRPC channel to an emulator with a large metadata limit."""
    return grpc.insecure_channel(host, options=[("grpc.max_metadata_size", MAX_METADATA_BYTES)])


def publisher_admin(host: str, *, channel: grpc.Channel | None = None) -> PublisherClient:
    """Return a ``google.pubsub_v1.PublisherClient`` bound to the emulator at ``host``.

    ``channel`` replaces the channel the client would open (``host`` is then unused).
    """
    from google.pubsub_v1 import PublisherClient  # noqa: PLC0415
    from google.pubsub_v1.services.publisher.transports.grpc import (  # noqa: PLC0415
        PublisherGrpcTransport,
    )

    transport = PublisherGrpcTransport(channel=channel or emulator_channel(host))
    return PublisherClient(transport=transport)


def subscriber_admin(host: str, *, channel: grpc.Channel | None = None) -> SubscriberClient:
    """Return a ``google.pubsub_v1.SubscriberClient`` bound to the emulator at ``host``.

    ``channel`` replaces the channel the client would open (``host`` is then unused).
    """
    from google.pubsub_v1 import SubscriberClient  # noqa: PLC0415
    from google.pubsub_v1.services.subscriber.transports.grpc import (  # noqa: PLC0415
        SubscriberGrpcTransport,
    )

    transport = SubscriberGrpcTransport(channel=channel or emulator_channel(host))
    return SubscriberClient(transport=transport)


@dataclass(frozen=True)
class Bootstrapped:
    """Full resource paths of a bootstrapped topology.

    Attributes:
        project: The project the resources live in.
        topics: Topic id to ``projects/P/topics/ID``.
        subscriptions: Subscription id to ``projects/P/subscriptions/ID``.
        created: Paths this call created (the others existed already).
    """

    project: str
    topics: dict[str, str] = field(default_factory=dict)
    subscriptions: dict[str, str] = field(default_factory=dict)
    created: tuple[str, ...] = ()


def _subscription_request(spec: SubscriptionSpec, project: str) -> dict[str, object]:
    request: dict[str, object] = {
        "name": subscription_path(project, spec.name),
        "topic": topic_path(project, spec.topic),
        "ack_deadline_seconds": spec.ack_deadline_seconds,
        "enable_exactly_once_delivery": spec.exactly_once,
        "enable_message_ordering": spec.ordering,
    }
    if spec.dead_letter is not None:
        request["dead_letter_policy"] = {
            "dead_letter_topic": topic_path(project, spec.dead_letter.topic),
            "max_delivery_attempts": spec.dead_letter.max_delivery_attempts,
        }
    if spec.retry is not None:
        request["retry_policy"] = {
            "minimum_backoff": datetime.timedelta(seconds=spec.retry.min_backoff_seconds),
            "maximum_backoff": datetime.timedelta(seconds=spec.retry.max_backoff_seconds),
        }
    if spec.push is not None:
        request["push_config"] = spec.push.config()
    return request


def _differences(existing: Subscription, spec: SubscriptionSpec, project: str) -> list[str]:
    wanted = {
        "topic": topic_path(project, spec.topic),
        "ack_deadline_seconds": spec.ack_deadline_seconds,
        "enable_exactly_once_delivery": spec.exactly_once,
        "enable_message_ordering": spec.ordering,
    }
    differences = [
        f"{key}={getattr(existing, key)!r} (declared {value!r})"
        for key, value in wanted.items()
        if getattr(existing, key) != value
    ]
    endpoint = spec.push.endpoint if spec.push is not None else ""
    if existing.push_config.push_endpoint != endpoint:
        differences.append(
            f"push_endpoint={existing.push_config.push_endpoint!r} (declared {endpoint!r})"
        )
    return differences


def bootstrap(
    topology: Topology,
    *,
    project: str,
    pubsub_host: str | None = None,
    publisher: PublisherClient | None = None,
    subscriber: SubscriberClient | None = None,
) -> Bootstrapped:
    """Create what ``topology`` declares and is missing in ``project``; return all paths.

    Args:
        topology: What to create.
        project: Project id the resources belong to.
        pubsub_host: Emulator ``host:port``; default ``PUBSUB_EMULATOR_HOST``.
        publisher: A ``google.pubsub_v1`` (or ``google.cloud.pubsub_v1``) publisher
            client to use instead of a new one; it is not closed.
        subscriber: Likewise for subscriptions.

    Raises:
        EmulatorError: No client, no host and no ``PUBSUB_EMULATOR_HOST``.
        google.api_core.exceptions.GoogleAPICallError: A call failed other
            than with ``AlreadyExists``.
    """
    from google.api_core.exceptions import AlreadyExists  # noqa: PLC0415

    channel: grpc.Channel | None = None
    if publisher is None or subscriber is None:
        host = pubsub_host or os.environ.get("PUBSUB_EMULATOR_HOST")
        if not host:
            raise EmulatorError(
                "bootstrap() needs pubsub_host or PUBSUB_EMULATOR_HOST: it only talks to emulators."
            )
        channel = emulator_channel(host)
        publisher = publisher or publisher_admin(host, channel=channel)
        subscriber = subscriber or subscriber_admin(host, channel=channel)
    result = Bootstrapped(project=project)
    created: list[str] = []
    try:
        for topic in topology.topics:
            path = topic_path(project, topic.name)
            try:
                publisher.create_topic(request={"name": path})
                created.append(path)
            except AlreadyExists:
                logger.debug("topic %s exists", path)
            result.topics[topic.name] = path
        for spec in topology.subscriptions:
            request = _subscription_request(spec, project)
            path = str(request["name"])
            try:
                subscriber.create_subscription(request=request)
                created.append(path)
            except AlreadyExists:
                existing = subscriber.get_subscription(request={"subscription": path})
                diff = _differences(existing, spec, project)
                if diff:
                    logger.warning(
                        "subscription %s exists with other settings, left as is: %s",
                        path,
                        ", ".join(diff),
                    )
            result.subscriptions[spec.name] = path
    finally:
        if channel is not None:
            channel.close()
    logger.info("bootstrapped %s: %d created", project, len(created))
    return Bootstrapped(
        project=project,
        topics=result.topics,
        subscriptions=result.subscriptions,
        created=tuple(created),
    )


@dataclass(frozen=True)
class SubscriptionHandle:
    """A fresh topic and subscription made for one test.

    Attributes:
        project: Project id.
        topic_id: Topic id.
        subscription_id: Subscription id.
        topic_path: ``projects/P/topics/TOPIC``.
        subscription_path: ``projects/P/subscriptions/SUB``.
        dead_letter_topic_path: The dead-letter topic, if one was asked for.
        dead_letter_subscription_path: A subscription on the dead-letter topic
            (so that forwarded messages are kept and can be pulled), if any.
        push_endpoint: Where the emulator pushes the messages, for a push
            subscription; None for a pull one.
    """

    project: str
    topic_id: str
    subscription_id: str
    topic_path: str
    subscription_path: str
    dead_letter_topic_path: str | None = None
    dead_letter_subscription_path: str | None = None
    push_endpoint: str | None = None


def create_subscription(
    *,
    project: str,
    publisher: PublisherClient,
    subscriber: SubscriberClient,
    exactly_once: bool = True,
    ack_deadline_seconds: int = 10,
    max_delivery_attempts: int | None = None,
    retry: RetrySpec | None = None,
    ordering: bool = False,
    push: PushSpec | None = None,
    prefix: str = "t",
) -> SubscriptionHandle:
    """Create a uniquely named topic and subscription (and dead-letter pair if asked).

    Args:
        project: Project id.
        publisher: Client used to create topics.
        subscriber: Client used to create subscriptions.
        exactly_once: Enable exactly-once delivery.
        ack_deadline_seconds: Ack deadline, 10..600.
        max_delivery_attempts: If set (5..100), add a dead-letter topic with a
            subscription of its own and forward after that many deliveries.
        retry: Retry policy back-off, or None for immediate redelivery.
        ordering: Enable message ordering on the subscription (ordering keys are
            delivered in publish order; publish with message ordering enabled).
        push: Make it a push subscription to this endpoint (with
            ``exactly_once=False``: Pub/Sub has exactly-once delivery for pull
            subscriptions only). :func:`set_push` points it elsewhere later.
        prefix: Start of the generated ids (a letter first).

    Raises:
        TopologyError: An option is out of range.
    """
    base = unique_id(prefix)
    topics = [TopicSpec(base)]
    dead_letter = None
    extra: list[SubscriptionSpec] = []
    if max_delivery_attempts is not None:
        topics.append(TopicSpec(f"{base}-dead"))
        dead_letter = DeadLetterSpec(f"{base}-dead", max_delivery_attempts)
        extra.append(SubscriptionSpec(f"{base}-dead-sub", topic=f"{base}-dead"))
    main = SubscriptionSpec(
        f"{base}-sub",
        topic=base,
        exactly_once=exactly_once,
        ack_deadline_seconds=ack_deadline_seconds,
        dead_letter=dead_letter,
        retry=retry,
        ordering=ordering,
        push=push,
    )
    topology = Topology(topics=tuple(topics), subscriptions=(main, *extra))
    made = bootstrap(topology, project=project, publisher=publisher, subscriber=subscriber)
    return SubscriptionHandle(
        project=project,
        topic_id=base,
        subscription_id=main.name,
        topic_path=made.topics[base],
        subscription_path=made.subscriptions[main.name],
        dead_letter_topic_path=made.topics.get(f"{base}-dead"),
        dead_letter_subscription_path=made.subscriptions.get(f"{base}-dead-sub"),
        push_endpoint=push.endpoint if push is not None else None,
    )


def set_push(subscriber: SubscriberClient, subscription_path: str, push: PushSpec | None) -> None:
    """Point a subscription's pushes at ``push`` (another endpoint), or make it a pull one (None).

    The emulator's next delivery attempt of each message, a retry included,
    goes to the new endpoint (``modify_push_config``; measured: a push
    subscription turned pull and back keeps its backlog).
    """
    config = push.config() if push is not None else {}
    subscriber.modify_push_config(
        request={"subscription": subscription_path, "push_config": config}, timeout=10
    )


def delete_subscription(
    handle: SubscriptionHandle, *, publisher: PublisherClient, subscriber: SubscriberClient
) -> None:
    """Delete what :func:`create_subscription` made; missing resources are ignored."""
    from google.api_core.exceptions import NotFound  # noqa: PLC0415

    for sub_path in (handle.subscription_path, handle.dead_letter_subscription_path):
        if sub_path is not None:
            with contextlib.suppress(NotFound):
                subscriber.delete_subscription(request={"subscription": sub_path})
    for topic in (handle.topic_path, handle.dead_letter_topic_path):
        if topic is not None:
            with contextlib.suppress(NotFound):
                publisher.delete_topic(request={"topic": topic})
