"""The function sample against the real emulators, called as functions-framework would.

Real messages are published and pulled, then handed to the function as
Eventarc's CloudEvents (their ``data`` as Eventarc builds it), each twice,
as an at-least-once trigger may. functions-framework itself is not needed:
the entry point is the same function, undecorated where the framework is
not installed.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from samples.push_function import main
from tests.support.observe import job_document, pull_now

pytestmark = pytest.mark.emulator


class CloudEvent:
    """What functions-framework passes: ``.data`` and the attributes by name."""

    def __init__(self, data: Any, **attributes: str) -> None:
        self.data = data
        self._attributes = attributes

    def __getitem__(self, name: str) -> str:
        return self._attributes[name]


def as_event(received: Any, subscription: str) -> CloudEvent:
    """A pulled message as Eventarc's Pub/Sub trigger delivers it to a function."""
    message = received.message
    data = {
        "message": {
            "data": base64.b64encode(message.data).decode(),
            "attributes": dict(message.attributes),
            "messageId": message.message_id,
            "publishTime": message.publish_time.isoformat().replace("+00:00", "Z"),
        },
        "subscription": subscription,
    }
    return CloudEvent(
        data,
        id=message.message_id,
        type="google.cloud.pubsub.topic.v1.messagePublished",
        source="//pubsub.googleapis.com/projects/p/topics/signups",
    )


@pytest.fixture
def function_env(
    emulators: Emulators,
    make_subscription: Any,
    firestore_collection: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[SubscriptionHandle, SubscriptionHandle]]:
    trigger: SubscriptionHandle = make_subscription(exactly_once=False)
    failures: SubscriptionHandle = make_subscription(exactly_once=False)
    for name, value in {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": trigger.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "signup_id",
        "PUBSUB_WORKER_LEASE_SECONDS": "60",
        "PUBSUB_WORKER_FAILURE_TOPIC": failures.topic_path,
    }.items():
        monkeypatch.setenv(name, value)
    yield trigger, failures
    main.deliveries.close()


def test_each_signup_gets_one_email_however_often_its_event_comes(
    function_env: tuple[SubscriptionHandle, SubscriptionHandle],
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trigger, failures = function_env
    signups = {"s-1": b'{"email": "ada@example.com"}', "s-2": b"not json"}
    for signup_id, data in signups.items():
        publisher.publish(trigger.topic_path, data, signup_id=signup_id).result()
    pulled = pull_now(subscriber, trigger.subscription_path)
    assert len(pulled) == 2
    caplog.set_level(logging.INFO)
    for received in pulled * 2:  # every event delivered twice
        main.welcome(as_event(received, trigger.subscription_path))
    sent = [r.getMessage() for r in caplog.records if "sent the welcome email" in r.getMessage()]
    assert sent == ["sent the welcome email to ada@example.com"]
    sub = trigger.subscription_path
    assert job_document(firestore_client, firestore_collection, sub, "s-1")["status"] == "completed"
    assert job_document(firestore_client, firestore_collection, sub, "s-2")["status"] == "failed"
    reviewed = pull_now(subscriber, failures.subscription_path)
    assert [m.message.attributes["pubsub_worker_key"] for m in reviewed] == ["s-2"]


def test_an_event_of_another_subscription_is_not_taken(
    function_env: tuple[SubscriptionHandle, SubscriptionHandle],
    publisher: Any,
    subscriber: Any,
) -> None:
    trigger, _ = function_env
    publisher.publish(trigger.topic_path, b'{"email": "x@example.com"}', signup_id="s-9").result()
    received = pull_now(subscriber, trigger.subscription_path)[0]
    event = as_event(received, "projects/p/subscriptions/someone-else")
    with pytest.raises(main.NotNow) as caught:
        main.welcome(event)
    assert caught.value.answer.status == 400
    with pytest.raises(main.NotNow) as malformed:
        main.welcome(CloudEvent({"no": "message"}, id="1"))
    assert malformed.value.answer.outcome == "malformed"
