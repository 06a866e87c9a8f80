"""The Pub/Sub emulator through the fixtures: exactly-once acks and topology."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from google.cloud.pubsub_v1.subscriber import exceptions as sub_exceptions
from google.cloud.pubsub_v1.subscriber.message import Message
from google.pubsub_v1.types import Subscription

from emulator import (
    DeadLetterSpec,
    Emulators,
    RetrySpec,
    SubscriptionHandle,
    SubscriptionSpec,
    TopicSpec,
    Topology,
    bootstrap,
    unique_id,
)
from emulator.pytest_plugin import MakeSubscription

pytestmark = pytest.mark.emulator

AckStatus = sub_exceptions.AcknowledgeStatus


def test_emulators_started_and_exported(emulators: Emulators) -> None:
    assert emulators.pubsub_host is not None
    assert emulators.pubsub_host.startswith("127.0.0.1:")
    assert emulators.firestore_host is not None
    assert emulators.firestore_host.startswith("127.0.0.1:")
    assert emulators.env() == {
        "PUBSUB_EMULATOR_HOST": emulators.pubsub_host,
        "FIRESTORE_EMULATOR_HOST": emulators.firestore_host,
        "GOOGLE_CLOUD_PROJECT": emulators.project,
    }
    assert all(os.environ[k] == v for k, v in emulators.env().items())
    assert set(emulators.ready_s) == {"pubsub", "firestore"}
    assert 0 < max(emulators.ready_s.values()) <= emulators.startup_s < 60
    assert emulators.alive()


def _receive(subscriber: Any, handle: SubscriptionHandle, count: int) -> list[Message]:
    """Stream-pull until ``count`` deliveries arrived; leave them un-acked."""
    got: list[Message] = []
    enough = threading.Event()

    def callback(message: Message) -> None:
        got.append(message)
        if len(got) >= count:
            enough.set()

    future = subscriber.subscribe(handle.subscription_path, callback)
    try:
        assert enough.wait(20), f"only {len(got)} of {count} deliveries arrived"
    finally:
        future.cancel()
        future.result(timeout=10)
    return got


def test_exactly_once_ack_round_trip(
    publisher: Any, subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    sub = subscriber.get_subscription(subscription=eod_subscription.subscription_path)
    assert sub.enable_exactly_once_delivery
    assert sub.ack_deadline_seconds == 10
    publisher.publish(eod_subscription.topic_path, b"hello", job="1").result(timeout=10)

    acked = threading.Event()
    status: list[object] = []

    def callback(message: Message) -> None:
        status.append(message.ack_with_response().result(timeout=10))
        acked.set()

    future = subscriber.subscribe(eod_subscription.subscription_path, callback)
    try:
        assert acked.wait(20)
    finally:
        future.cancel()
        future.result(timeout=10)
    assert status == [AckStatus.SUCCESS]
    # Acked for real: nothing is left to pull.
    left = subscriber.pull(
        subscription=eod_subscription.subscription_path,
        max_messages=5,
        return_immediately=True,
        timeout=5,
    )
    assert list(left.received_messages) == []


def test_stale_ack_id_after_redelivery_is_refused(
    publisher: Any, subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    publisher.publish(eod_subscription.topic_path, b"twice").result(timeout=10)
    got: list[Message] = []
    second = threading.Event()

    def callback(message: Message) -> None:
        got.append(message)
        if len(got) == 1:
            # Expire the first delivery now instead of waiting out the 10 s deadline.
            subscriber.modify_ack_deadline(
                subscription=eod_subscription.subscription_path,
                ack_ids=[message.ack_id],
                ack_deadline_seconds=0,
            )
        else:
            second.set()

    future = subscriber.subscribe(eod_subscription.subscription_path, callback)
    try:
        assert second.wait(30), "the message was not redelivered"
        first, newer = got[0], got[1]
        assert first.message_id == newer.message_id
        assert first.ack_id != newer.ack_id
        with pytest.raises(sub_exceptions.AcknowledgeError) as info:
            first.ack_with_response().result(timeout=10)
        assert info.value.error_code is AckStatus.INVALID_ACK_ID
        assert newer.ack_with_response().result(timeout=10) is AckStatus.SUCCESS
    finally:
        future.cancel()
        future.result(timeout=10)


def test_factory_dead_letter_and_retry_policy(
    subscriber: Any, make_subscription: MakeSubscription
) -> None:
    handle = make_subscription(
        exactly_once=False,
        ack_deadline_seconds=42,
        max_delivery_attempts=5,
        retry=RetrySpec(min_backoff_seconds=1, max_backoff_seconds=7.5),
    )
    sub: Subscription = subscriber.get_subscription(subscription=handle.subscription_path)
    assert not sub.enable_exactly_once_delivery
    assert sub.ack_deadline_seconds == 42
    assert sub.dead_letter_policy.dead_letter_topic == handle.dead_letter_topic_path
    assert sub.dead_letter_policy.max_delivery_attempts == 5
    assert sub.retry_policy.minimum_backoff.total_seconds() == 1
    assert sub.retry_policy.maximum_backoff.total_seconds() == 7.5
    assert handle.dead_letter_subscription_path is not None
    dead = subscriber.get_subscription(subscription=handle.dead_letter_subscription_path)
    assert dead.topic == handle.dead_letter_topic_path


def test_bootstrap_is_idempotent(emulators: Emulators, publisher: Any, subscriber: Any) -> None:
    prefix = unique_id("boot")
    topology = Topology(
        topics=(TopicSpec(f"{prefix}-jobs"), TopicSpec(f"{prefix}-dead")),
        subscriptions=(
            SubscriptionSpec(
                f"{prefix}-worker",
                topic=f"{prefix}-jobs",
                exactly_once=True,
                ack_deadline_seconds=20,
                dead_letter=DeadLetterSpec(f"{prefix}-dead", 6),
                retry=RetrySpec(2, 30),
            ),
        ),
    )
    first = emulators.bootstrap(topology)
    paths = {
        f"projects/{emulators.project}/topics/{prefix}-jobs",
        f"projects/{emulators.project}/topics/{prefix}-dead",
        f"projects/{emulators.project}/subscriptions/{prefix}-worker",
    }
    assert set(first.created) == paths
    second = bootstrap(topology, project=emulators.project)  # host from the environment
    assert second.created == ()
    assert second.topics == first.topics
    assert second.subscriptions == first.subscriptions
    sub = subscriber.get_subscription(subscription=first.subscriptions[f"{prefix}-worker"])
    assert sub.enable_exactly_once_delivery
    assert sub.dead_letter_policy.max_delivery_attempts == 6
    assert sub.retry_policy.maximum_backoff.total_seconds() == 30
    topics = {t.name for t in publisher.list_topics(project=f"projects/{emulators.project}")}
    assert paths - {first.subscriptions[f"{prefix}-worker"]} <= topics


def test_bootstrap_leaves_a_differing_subscription_alone(
    emulators: Emulators, subscriber: Any, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_id("drift")
    declared = Topology(
        topics=(TopicSpec(name),),
        subscriptions=(SubscriptionSpec(f"{name}-sub", topic=name, ack_deadline_seconds=30),),
    )
    emulators.bootstrap(declared)
    changed = Topology(
        topics=declared.topics,
        subscriptions=(
            SubscriptionSpec(f"{name}-sub", topic=name, ack_deadline_seconds=60, exactly_once=True),
        ),
    )
    with caplog.at_level("WARNING", logger="emulator.bootstrap"):
        made = emulators.bootstrap(changed)
    assert made.created == ()
    assert "exists with other settings" in caplog.text
    assert "ack_deadline_seconds=30 (declared 60)" in caplog.text
    sub = subscriber.get_subscription(subscription=made.subscriptions[f"{name}-sub"])
    assert sub.ack_deadline_seconds == 30
    assert not sub.enable_exactly_once_delivery


def test_unique_ids_do_not_collide(make_subscription: MakeSubscription) -> None:
    a, b = make_subscription(), make_subscription()
    assert a.topic_id != b.topic_id
    assert a.subscription_path != b.subscription_path
