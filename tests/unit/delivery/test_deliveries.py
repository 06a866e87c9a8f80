"""Delivery generations and the per-key gate of one process."""

from __future__ import annotations

import threading
import time

from pubsub_worker._delivery.generations import DeliveryTracker, KeyGate, OrderingKeys


def test_a_newer_delivery_supersedes_the_older_one() -> None:
    tracker = DeliveryTracker()
    old = tracker.register("m1", "ack-old")
    assert tracker.is_current(old)
    new = tracker.register("m1", "ack-new")
    assert not tracker.is_current(old)
    assert tracker.is_current(new)
    assert tracker.superseded("m1", old.digest)
    assert not tracker.superseded("m1", new.digest)
    tracker.forget(old)  # the stale callback ending must not forget the newer delivery
    assert tracker.is_current(new)
    tracker.forget(new)
    assert len(tracker) == 0
    assert not tracker.is_current(new)  # once forgotten, nothing is current


def test_a_lost_delivery_is_not_current() -> None:
    tracker = DeliveryTracker()
    delivery = tracker.register("m1", "ack")
    delivery.lost.set()
    assert not tracker.is_current(delivery)


def test_a_second_message_with_the_same_key_waits_its_turn() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    first = tracker.register("m1", "a1")
    second = tracker.register("m2", "a2")
    assert gate.acquire("key", first, timeout_s=1)
    order: list[str] = []

    def later() -> None:
        assert gate.acquire("key", second, timeout_s=5)
        order.append("second")
        gate.release("key", second)

    thread = threading.Thread(target=later)
    thread.start()
    time.sleep(0.2)
    order.append("first done")
    gate.release("key", first)
    thread.join(5)
    assert order == ["first done", "second"]


def test_a_newer_delivery_of_the_same_message_takes_the_key_over_at_once() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    old = tracker.register("m1", "a1")
    assert gate.acquire("key", old, timeout_s=1)
    new = tracker.register("m1", "a2")
    started = time.monotonic()
    assert gate.acquire("key", new, timeout_s=5)
    assert time.monotonic() - started < 0.5
    gate.release("key", old)  # the stale holder's release does not free the new holder
    other = tracker.register("m9", "a9")
    assert not gate.acquire("key", other, timeout_s=0.2)


def test_waiting_ends_when_the_waiter_is_superseded() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    holder = tracker.register("m1", "a1")
    waiter = tracker.register("m2", "a2")
    assert gate.acquire("key", holder, timeout_s=1)
    threading.Timer(0.2, lambda: tracker.register("m2", "a3")).start()
    started = time.monotonic()
    assert not gate.acquire("key", waiter, timeout_s=10)
    assert time.monotonic() - started < 3


def test_a_later_message_of_a_key_waits_for_an_earlier_unfinished_one() -> None:
    keys = OrderingKeys(expiry_s=60)
    keys.unfinished("o", "m1", published=100.0, arrival=1, delay_s=30, now=0)
    assert keys.blocked_for("o", "m2", published=101.0, arrival=2, now=5) == 25  # until m1 is back
    assert keys.blocked_for("o", "m1", published=100.0, arrival=3, now=5) is None  # m1 itself
    assert keys.blocked_for("o", "m0", published=99.0, arrival=4, now=5) is None  # earlier
    assert keys.blocked_for("other", "m2", published=101.0, arrival=5, now=5) is None
    keys.finished("o", "m1")
    assert keys.blocked_for("o", "m2", published=101.0, arrival=6, now=6) is None
    assert len(keys) == 0


def test_messages_published_at_the_same_time_keep_the_order_they_arrived_in() -> None:
    """One publish request can give several messages the same publish time."""
    keys = OrderingKeys(expiry_s=60)
    keys.unfinished("o", "m1", published=7.0, arrival=1, delay_s=10, now=0)
    assert keys.blocked_for("o", "m2", published=7.0, arrival=2, now=1) == 9
    keys.unfinished("o", "m2", published=7.0, arrival=2, delay_s=11, now=1)
    # m1 comes back (a new arrival number): it keeps its first place, m2 does not hold it back.
    assert keys.blocked_for("o", "m1", published=7.0, arrival=9, now=10) is None
    keys.unfinished("o", "m1", published=7.0, arrival=9, delay_s=0, now=10)  # retried again
    assert keys.blocked_for("o", "m1", published=7.0, arrival=10, now=11) is None
    assert keys.blocked_for("o", "m2", published=7.0, arrival=11, now=11) == 0


def test_a_held_back_message_holds_back_the_ones_after_it() -> None:
    """m2 deferred behind m1 is unfinished too: m3 may not pass it once m1 is done."""
    keys = OrderingKeys(expiry_s=60)
    keys.unfinished("o", "m1", published=1.0, arrival=1, delay_s=10, now=0)
    keys.unfinished("o", "m2", published=2.0, arrival=2, delay_s=11, now=0)
    keys.finished("o", "m1")
    assert keys.blocked_for("o", "m3", published=3.0, arrival=3, now=1) == 10
    assert keys.blocked_for("o", "m2", published=2.0, arrival=4, now=1) is None


def test_an_entry_expires_so_a_key_is_never_blocked_for_good() -> None:
    """The earlier message may have come back to another worker and been done there."""
    keys = OrderingKeys(expiry_s=60)
    keys.unfinished("o", "m1", published=1.0, arrival=1, delay_s=10, now=0)
    assert keys.blocked_for("o", "m2", published=2.0, arrival=2, now=69) == 0
    assert keys.blocked_for("o", "m2", published=2.0, arrival=3, now=70) is None
    assert len(keys) == 0


def test_ordering_entries_are_bounded() -> None:
    keys = OrderingKeys(expiry_s=60)
    keys.MAX_ENTRIES = 3
    for n in range(5):
        keys.unfinished(f"k{n}", "m", published=1.0, arrival=n, delay_s=10, now=0)
    assert len(keys) == 3
    assert keys.blocked_for("k4", "m2", published=2.0, arrival=9, now=1) is None
