"""Acks sent straight to Pub/Sub by the wrapper, with a real subscriber on the emulators.

The wrapper acks the messages of a stock client's streaming pull itself,
several ``Acknowledge`` RPCs at once (:mod:`pubsub_worker._delivery.acks`),
then drops each from the client's lease management. What the client did
after its own ack must still happen: the flow-control slot is freed (one
message at a time still gets every message through), an ordering key's
next message comes once the previous one is acked, every answer is
``SUCCESS`` and nothing comes back. The answers' mapping and the fallbacks
are unit-tested in ``tests/unit/delivery/test_acks.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeStatus
from google.cloud.pubsub_v1.subscriber.message import Message

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from pubsub_worker._delivery import acks
from pubsub_worker._delivery.acks import Acks
from tests.support.observe import assert_not_redelivered

from .test_adoption_paths import (
    Recorder,
    Tally,
    consuming,
    lease_flow,
    publish_keys,
    states,
    wait_until,
)

pytestmark = pytest.mark.emulator


class _Sent:
    """The ack IDs each direct ``Acknowledge`` RPC carried, and the acks the client sent:
    ``stock`` ones instead of a direct ack, ``fallback`` ones after a direct RPC refused
    as a whole or transiently (a loaded emulator does, now and then: the client's path
    and its retries take the ack then, as in production)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fast_network: bool = False) -> None:
        self._lock = threading.Lock()  # guards rpcs, stock, fallback and dropped
        self.rpcs: list[int] = []
        self.stock = 0
        self.fallback = 0
        self.dropped = 0
        self._settling = threading.local()
        send, stock_ack, drop = Acks._send, Message.ack_with_response, Message.drop
        settle = acks._settle

        def counted(acks: Acks, stream: Any, batch: list[Any]) -> None:
            with self._lock:
                self.rpcs.append(len(batch))
            send(acks, stream, batch)

        def settling(message: Any, answer: Any, error: Any, reason: str) -> None:
            self._settling.on = True
            try:
                settle(message, answer, error, reason)
            finally:
                self._settling.on = False

        def stock(message: Message) -> Any:
            with self._lock:
                if getattr(self._settling, "on", False):
                    self.fallback += 1
                else:
                    self.stock += 1
            return stock_ack(message)

        def dropped(message: Message) -> None:
            with self._lock:
                self.dropped += 1
            drop(message)

        if fast_network:  # every round trip counts as short, no probe: acks go the stock way
            monkeypatch.setattr(acks, "SLOW_AFTER_S", float("inf"))
            monkeypatch.setattr(acks, "PROBE_S", float("inf"))
        else:  # the emulator answers in a millisecond: count every round trip as long
            monkeypatch.setattr(acks, "SLOW_AFTER_S", 0.0)
        monkeypatch.setattr(Acks, "_send", counted)
        monkeypatch.setattr(acks, "_settle", settling)
        monkeypatch.setattr(Message, "ack_with_response", stock)
        monkeypatch.setattr(Message, "drop", dropped)

    def acks(self) -> int:
        with self._lock:
            return sum(self.rpcs)


@pytest.mark.parametrize("runner", ["subscribe", "run"])
def test_one_message_at_a_time_every_message_is_acked_directly_and_none_comes_back(
    runner: str,
    monkeypatch: pytest.MonkeyPatch,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``max_messages=1``: every message gets through, each acked directly, then dropped.

    Dropped as the client drops a message after its own ack: that frees the
    flow-control slot at once (without it the client would free it only
    when a lease extension finds the ack ID gone, seconds later).
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    if runner == "run":
        settings = settings.model_copy(update={"max_messages": 1})
    hooks, work, sent = Recorder(), Tally(), _Sent(monkeypatch)

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("work", lambda: work.add(job.key))

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, hooks=hooks)
    keys = [f"job-{n}" for n in range(6)]
    flow = lease_flow(settings, max_messages=1)
    with consuming(wrapped, settings, runner, flow_control=flow):
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        assert wait_until(lambda: hooks.answered(ids)), hooks.snapshot()

    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}
    assert sent.acks() == len(keys)  # every one straight to Pub/Sub, none through the client
    assert sent.stock == 0
    # out of the client's lease management once answered (by the client's own ack if refused)
    assert sent.dropped == len(keys) - sent.fallback
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


def test_an_unchanged_stock_callback_awaiting_its_ack_has_it_sent_directly_on_a_fast_network(
    monkeypatch: pytest.MonkeyPatch,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """Round trips count as short, where acks go the stock way (all but the first, sent
    before a round trip is known), but a thread waiting in ``ack_with_response().result()``
    does not wait for the dispatcher's batch: every ack goes straight to Pub/Sub, each
    answered ``SUCCESS``, nothing comes back."""
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work, sent = Recorder(), Tally(), _Sent(monkeypatch, fast_network=True)
    answers: list[Any] = []

    def callback(message: Any) -> None:  # as written before the one added line
        work.add(message.attributes["op"])
        answers.append(message.ack_with_response().result(timeout=30))

    wrapped = pubsub_worker.exactly_once(callback, settings=settings, hooks=hooks)
    keys = [f"job-{n}" for n in range(6)]
    flow = lease_flow(settings, max_messages=1)
    with consuming(wrapped, settings, "subscribe", flow_control=flow):
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        assert wait_until(lambda: hooks.answered(ids)), hooks.snapshot()

    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert answers == [AcknowledgeStatus.SUCCESS] * len(keys)
    assert sent.acks() == len(keys)  # every one straight to Pub/Sub, none through the client
    assert sent.stock == 0
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


def test_an_ordering_key_goes_on_after_each_direct_ack(
    monkeypatch: pytest.MonkeyPatch,
    emulators: Emulators,
    make_subscription: Callable[..., SubscriptionHandle],
    firestore_client: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """The client hands out a key's next message only once the one before is settled."""
    ordered = make_subscription(exactly_once=True, ordering=True, ack_deadline_seconds=10)
    settings = settings_for(ordered, key_attribute="op")
    hooks, sent = Recorder(), _Sent(monkeypatch)
    order: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("work", lambda: order.append(job.key))

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, hooks=hooks)
    keys = [f"job-{n}" for n in range(5)]
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    with consuming(wrapped, settings, "subscribe"):
        ids = [
            publisher.publish(ordered.topic_path, b"x", ordering_key="k", op=key).result()
            for key in keys
        ]
        assert wait_until(lambda: hooks.answered(ids)), hooks.snapshot()

    assert order == keys
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}
    assert sent.acks() == len(keys)
    assert sent.stock == 0
    assert sent.dropped == len(keys) - sent.fallback
