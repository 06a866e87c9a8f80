"""Stale streams: what the Pub/Sub emulator keeps serving for a subscriber that is gone.

Whether a stream is left is read without any subscriber running: messages
published then are either still on the subscription (a synchronous pull
returns them) or taken by a stream nobody reads (the pull returns none).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest

from emulator import Emulators, SubscriptionHandle, end_streams

pytestmark = pytest.mark.emulator

PROBES = 20


def available_after_publishing(publisher: Any, subscriber: Any, handle: SubscriptionHandle) -> int:
    """Publish PROBES messages with no subscriber running; how many a pull still finds (acked)."""
    for future in [publisher.publish(handle.topic_path, b"probe") for _ in range(PROBES)]:
        future.result()
    time.sleep(1.0)  # a stale stream takes new messages within 50 ms
    found = 0
    while True:
        response = subscriber.pull(
            request={
                "subscription": handle.subscription_path,
                "max_messages": 100,
                "return_immediately": True,
            },
            timeout=10,
        )
        if not response.received_messages:
            return found
        found += len(response.received_messages)
        subscriber.acknowledge(
            request={
                "subscription": handle.subscription_path,
                "ack_ids": [m.ack_id for m in response.received_messages],
            }
        )


def subscribe_then_cancel(client: Any, publisher: Any, handle: SubscriptionHandle) -> None:
    """A subscriber that gets one message and closes as the stock client does: a cancel."""
    got: list[Any] = []

    def ack(message: Any) -> None:
        message.ack_with_response().result(timeout=30)
        got.append(message)

    future = client.subscribe(handle.subscription_path, callback=ack)
    publisher.publish(handle.topic_path, b"first").result()
    deadline = time.monotonic() + 30
    while not got:
        assert time.monotonic() < deadline, "the first message never came"
        time.sleep(0.05)
    future.cancel()
    future.result(timeout=30)
    client.close()


def test_a_cancelled_stream_keeps_taking_messages_until_ended(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    make_subscription: Callable[..., SubscriptionHandle],
) -> None:
    handle = make_subscription(exactly_once=True, ack_deadline_seconds=60)
    assert available_after_publishing(publisher, subscriber, handle) == PROBES  # no stream yet

    subscribe_then_cancel(pubsub_v1.SubscriberClient(), publisher, handle)
    # A stale stream took them.
    assert available_after_publishing(publisher, subscriber, handle) == 0

    end_streams(subscriber, handle.subscription_path)
    assert available_after_publishing(publisher, subscriber, handle) == PROBES


def test_the_command_ends_them(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    make_subscription: Callable[..., SubscriptionHandle],
) -> None:
    handle = make_subscription(exactly_once=True, ack_deadline_seconds=60)
    subscribe_then_cancel(pubsub_v1.SubscriberClient(), publisher, handle)
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": handle.project}
    ended = subprocess.run(
        [sys.executable, "-m", "emulator", "end-streams", handle.subscription_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.strip() == (
        f"ended the streams of {handle.subscription_path} at {emulators.pubsub_host}"
    )
    assert available_after_publishing(publisher, subscriber, handle) == PROBES


def test_the_command_needs_an_emulator(emulators: Emulators) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
    refused = subprocess.run(
        [sys.executable, "-m", "emulator", "end-streams", "projects/p/subscriptions/s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "PUBSUB_EMULATOR_HOST or --host" in refused.stderr
