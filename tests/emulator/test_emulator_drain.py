"""drain_messages: every message until the subscription stays quiet, acked, copies counted."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from emulator import SubscriptionHandle, drain_messages

pytestmark = pytest.mark.emulator


def _publish(publisher: Any, handle: SubscriptionHandle, *payloads: bytes) -> None:
    for future in [publisher.publish(handle.topic_path, data) for data in payloads]:
        future.result(timeout=10)


class _PublishingOnEmptyPulls:
    """A subscriber that publishes the next of ``later`` each time a pull finds nothing."""

    def __init__(
        self, subscriber: Any, publisher: Any, handle: SubscriptionHandle, later: list[bytes]
    ) -> None:
        self._subscriber = subscriber
        self._publisher = publisher
        self._handle = handle
        self._later = list(later)

    def pull(self, **kwargs: Any) -> Any:
        try:
            response = self._subscriber.pull(**kwargs)
        except Exception:
            self._publish_next()  # an empty pull that ran into its deadline
            raise
        if not response.received_messages:
            self._publish_next()
        return response

    def acknowledge(self, **kwargs: Any) -> None:
        self._subscriber.acknowledge(**kwargs)

    def _publish_next(self) -> None:
        if self._later:
            _publish(self._publisher, self._handle, self._later.pop(0))


def test_every_message_is_returned_and_acked(
    publisher: Any, subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    # More than one pull's 100, each payload published twice: copies are each returned.
    payloads = [f"m-{i}".encode() for i in range(120)] * 2
    _publish(publisher, eod_subscription, *payloads)

    drained = drain_messages(subscriber, eod_subscription.subscription_path, quiet_s=1.0)

    assert Counter(m.data for m in drained) == Counter(payloads)
    assert len({m.message_id for m in drained}) == 240
    # Acked: nothing comes back, even after the ack deadline (10 s) has passed.
    again = drain_messages(subscriber, eod_subscription.subscription_path, quiet_s=12.0)
    assert again == []


def test_an_empty_subscription_gives_an_empty_list(
    subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    assert drain_messages(subscriber, eod_subscription.subscription_path, quiet_s=0.5) == []


def test_the_quiet_window_restarts_with_each_message(
    publisher: Any, subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    """Each message is published only after a pull found nothing: all four are drained.

    An empty pull is held open about a second, so the last one arrives well
    after the first window of ``quiet_s`` would have closed.
    """
    later = [b"one", b"two", b"three", b"four"]
    watched = _PublishingOnEmptyPulls(subscriber, publisher, eod_subscription, later)

    drained = drain_messages(
        watched,  # type: ignore[arg-type]
        eod_subscription.subscription_path,
        quiet_s=3.0,
    )

    assert [m.data for m in drained] == later


def test_a_subscription_that_never_goes_quiet_raises_timeout(
    publisher: Any, subscriber: Any, eod_subscription: SubscriptionHandle
) -> None:
    stop = threading.Event()

    def keep_publishing() -> None:
        while not stop.wait(0.1):
            _publish(publisher, eod_subscription, b"more")

    feeder = threading.Thread(target=keep_publishing, daemon=True)
    feeder.start()
    try:
        with pytest.raises(TimeoutError, match=r"was not quiet for 2\.0 s within 4\.0 s"):
            drain_messages(
                subscriber, eod_subscription.subscription_path, quiet_s=2.0, timeout_s=4.0
            )
    finally:
        stop.set()
        feeder.join(timeout=10)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quiet_s": 0.0}, "quiet_s must be positive"),
        ({"quiet_s": 5.0, "timeout_s": 1.0}, "must be at least quiet_s"),
        ({"max_messages": 0}, "max_messages must be at least 1"),
    ],
)
def test_bad_options_are_refused_before_any_pull(options: dict[str, Any], message: str) -> None:
    class NoPulls:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} called")

    with pytest.raises(ValueError, match=message):
        drain_messages(NoPulls(), "projects/p/subscriptions/s", **options)  # type: ignore[arg-type]
