"""Production's message limits, held where the emulator is lenient.

The emulator accepts messages production rejects; the ``publisher`` fixture
and the library's own publish function refuse them before they are sent,
and let every valid message through unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest

from emulator import Emulators, SubscriptionHandle
from emulator.pytest_plugin import MakeSubscription
from pubsub_worker._support import clients
from pubsub_worker.errors import LimitExceeded

pytestmark = pytest.mark.emulator

HOSTILE: dict[str, dict[str, str]] = {
    "101 attributes": {f"k{i}": "v" for i in range(101)},
    "257-byte key": {"é" * 128 + "k": "v"},
    "1025-byte value": {"k": "v" * 1025},
    "goog prefix": {"googkey": "v"},
    "empty key": {"": "v"},
}

# At every limit, not past it: 100 attributes, 256-byte keys, 1024-byte values.
AT_THE_LIMITS = {f"{i:03d}" + "é" * 126 + "k": "€" * 341 + "v" for i in range(100)}


@pytest.fixture
def raw_publisher(emulators: Emulators) -> Iterator[Any]:
    """A stock PublisherClient on the emulator, with no checks of its own."""
    client: Any = pubsub_v1.PublisherClient()
    try:
        yield client
    finally:
        client.stop()
        client.transport.close()


@pytest.fixture
def plain(make_subscription: MakeSubscription) -> SubscriptionHandle:
    # At-least-once: a pulled message is acked without an exactly-once round trip.
    return make_subscription(exactly_once=False, ack_deadline_seconds=30)


def drain(subscriber: Any, handle: SubscriptionHandle, count: int) -> list[dict[str, str]]:
    """Pull and ack until ``count`` messages came, then 2 s more; return their attributes."""
    got: list[dict[str, str]] = []
    deadline = time.monotonic() + 20
    quiet_until: float | None = None
    while time.monotonic() < deadline:
        if len(got) >= count:
            quiet_until = quiet_until or time.monotonic() + 2
            if time.monotonic() >= quiet_until:
                break
        response = subscriber.pull(
            subscription=handle.subscription_path,
            max_messages=10,
            return_immediately=True,
            timeout=5,
        )
        received = list(response.received_messages)
        if received:
            subscriber.acknowledge(
                subscription=handle.subscription_path, ack_ids=[r.ack_id for r in received]
            )
            got.extend(dict(r.message.attributes) for r in received)
        else:
            time.sleep(0.1)
    return got


@pytest.mark.parametrize("case", list(HOSTILE))
def test_fixture_refuses_what_the_emulator_accepts(
    case: str,
    publisher: Any,
    raw_publisher: Any,
    subscriber: Any,
    plain: SubscriptionHandle,
) -> None:
    attributes = HOSTILE[case]
    with pytest.raises(LimitExceeded):
        publisher.publish(plain.topic_path, b"refused", **attributes)
    # The same message straight to the emulator goes through: the leniency is real.
    raw_publisher.publish(plain.topic_path, b"accepted", **attributes).result(timeout=10)
    assert drain(subscriber, plain, 1) == [attributes]


def test_fixture_passes_a_message_at_every_limit_unchanged(
    publisher: Any, subscriber: Any, plain: SubscriptionHandle
) -> None:
    # timeout= is a publish option, not an attribute: it is neither counted nor sent.
    publisher.publish(plain.topic_path, b"x" * 1000, timeout=30, **AT_THE_LIMITS).result(timeout=10)
    publisher.publish(plain.topic_path, b"small", op="op-1").result(timeout=10)
    got = drain(subscriber, plain, 2)
    assert sorted(got, key=len) == [{"op": "op-1"}, AT_THE_LIMITS]


def test_fixture_passes_everything_else_through(
    publisher: Any, emulators: Emulators, plain: SubscriptionHandle
) -> None:
    assert publisher.topic_path(emulators.project, "t") == f"projects/{emulators.project}/topics/t"
    topics = {t.name for t in publisher.list_topics(project=f"projects/{emulators.project}")}
    assert plain.topic_path in topics


def _publish_through_the_library(
    raw_publisher: Any, topic: str, attributes: Mapping[str, str]
) -> Any:
    publish = clients.publisher_function(raw_publisher)
    return publish(topic, b"data", attributes)


def test_publisher_function_fails_the_future_and_sends_nothing(
    raw_publisher: Any, subscriber: Any, plain: SubscriptionHandle
) -> None:
    for case, attributes in HOSTILE.items():
        future = _publish_through_the_library(raw_publisher, plain.topic_path, attributes)
        with pytest.raises(LimitExceeded):
            future.result(timeout=10)
        assert future.done(), case
    message_id = _publish_through_the_library(
        raw_publisher, plain.topic_path, AT_THE_LIMITS
    ).result(timeout=10)
    assert message_id
    # Only the valid message reached the topic.
    assert drain(subscriber, plain, 1) == [AT_THE_LIMITS]
