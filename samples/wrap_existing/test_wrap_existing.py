"""The one-line change, against the real emulators: each sign-up gets one email."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from samples.wrap_existing import subscriber as sample

pytestmark = pytest.mark.emulator

SIGNUPS = [  # the first sign-up is published twice, as a retrying upstream would
    ("s-1", "ada@example.com"),
    ("s-2", "grace@example.com"),
    ("s-1", "ada@example.com"),
]


def publish_signups(publisher: Any, topic: str) -> None:
    for signup_id, email in SIGNUPS:
        data = json.dumps({"email": email}).encode()
        publisher.publish(topic, data, signup_id=signup_id).result()


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def wrapped(
    monkeypatch: pytest.MonkeyPatch, eod_subscription: SubscriptionHandle, firestore_collection: str
) -> Iterator[ModuleType]:
    """The sample module, freshly imported with its settings in the environment."""
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", eod_subscription.subscription_path)
    monkeypatch.setenv("PUBSUB_WORKER_COLLECTION", firestore_collection)
    monkeypatch.setenv("PUBSUB_WORKER_KEY_ATTRIBUTE", "signup_id")
    module = importlib.reload(sample)  # a new wrapper, reading this environment
    yield module
    module.callback.close()


def test_the_wrapped_callback_sends_one_email_per_signup(
    wrapped: ModuleType,
    publisher: Any,
    subscriber: Any,
    eod_subscription: SubscriptionHandle,
) -> None:
    future = subscriber.subscribe(eod_subscription.subscription_path, callback=wrapped.callback)
    try:
        publish_signups(publisher, eod_subscription.topic_path)
        metrics = wrapped.callback.metrics
        wait_for(
            lambda: (
                metrics.get(pubsub_worker.Counter.COMPLETED) == 2
                and metrics.get(pubsub_worker.Counter.ALREADY_DONE) == 1
            )
        )
    finally:
        future.cancel()
        future.result(timeout=30)
    assert sorted(wrapped.sent) == ["ada@example.com", "grace@example.com"]


def test_without_the_line_the_duplicate_sends_a_second_email(
    wrapped: ModuleType,
    publisher: Any,
    subscriber: Any,
    make_subscription: Any,
) -> None:
    plain = make_subscription(exactly_once=True)
    original = wrapped.callback.__wrapped__  # the callback as it was before the line
    future = subscriber.subscribe(plain.subscription_path, callback=original)
    try:
        publish_signups(publisher, plain.topic_path)
        wait_for(lambda: len(wrapped.sent) == 3)
    finally:
        future.cancel()
        future.result(timeout=30)
    assert sorted(wrapped.sent) == ["ada@example.com", "ada@example.com", "grace@example.com"]
