"""Delivery generations, adoption and the per-key gate of one process."""

from __future__ import annotations

import threading
import time

from pubsub_worker._delivery.generations import (
    DeliveryTracker,
    GateAnswer,
    KeyGate,
    OrderingKeys,
)

HELD = GateAnswer.HELD


def test_a_newer_delivery_is_current_and_the_older_one_is_adopted() -> None:
    tracker = DeliveryTracker()
    old = tracker.register("m1", "ack-old")
    assert tracker.is_current(old)
    new = tracker.register("m1", "ack-new")
    assert not tracker.is_current(old)  # it never settles on Pub/Sub again
    assert tracker.owns(old)  # but it goes on with its job: the newer one adopts it
    assert old.successor is new
    assert tracker.is_current(new)
    tracker.forget(old)  # the older callback ending must not forget the newer delivery
    assert tracker.is_current(new)
    tracker.forget(new)
    assert len(tracker) == 0
    assert not tracker.is_current(new)  # once forgotten, nothing is current


def test_a_delivery_follows_another_only_while_one_of_its_message_is_in_flight() -> None:
    tracker = DeliveryTracker()
    first = tracker.register("m1", "a1")
    second = tracker.register("m1", "a2")  # the first one still runs: a redelivery
    other = tracker.register("m2", "b1")
    assert (first.follows, second.follows, other.follows) == (False, True, False)
    tracker.forget(first)
    tracker.forget(second)
    assert not tracker.register("m1", "a3").follows  # nothing of m1 in flight any more


def test_a_lost_delivery_is_neither_current_nor_an_owner() -> None:
    tracker = DeliveryTracker()
    delivery = tracker.register("m1", "ack")
    delivery.give_up("refused")
    assert not tracker.is_current(delivery)
    assert not tracker.owns(delivery)


def test_only_a_delivery_of_this_process_past_its_cap_counts_as_abandoned() -> None:
    tracker = DeliveryTracker()
    running = tracker.register("m1", "a1", deadline=100.0)
    assert not tracker.abandoned("m1", running.digest, now=99.0)
    assert tracker.abandoned("m1", running.digest, now=100.0)
    assert not tracker.abandoned("m2", running.digest, now=100.0)  # not that message's
    assert not tracker.abandoned("m1", "another process's delivery", now=100.0)
    tracker.forget(running)
    assert not tracker.abandoned("m1", running.digest, now=100.0)  # ended: nothing to take


def test_a_second_message_with_the_same_key_waits_its_turn() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    first = tracker.register("m1", "a1")
    second = tracker.register("m2", "a2")
    assert gate.acquire("key", first, timeout_s=1, other_s=1) is HELD
    order: list[str] = []

    def later() -> None:
        assert gate.acquire("key", second, timeout_s=5, other_s=5) is HELD
        order.append("second")
        gate.release("key", second)

    thread = threading.Thread(target=later)
    thread.start()
    time.sleep(0.2)
    order.append("first done")
    gate.release("key", first)
    thread.join(5)
    assert order == ["first done", "second"]


def test_a_release_wakes_the_delivery_waiting_for_its_key() -> None:
    """The waiter is notified (its wait returns True), not left to find the key free at its
    next timed look; a release with nobody waiting notifies nobody."""
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    holder, waiter = tracker.register("m1", "a1"), tracker.register("m2", "a2")
    woken: list[bool] = []
    waits = gate._cond.wait

    def wait(timeout: float | None = None) -> bool:
        notified = waits(timeout)
        woken.append(notified)
        return notified

    gate._cond.wait = wait  # type: ignore[method-assign]
    assert gate.acquire("key", holder, timeout_s=1, other_s=1) is HELD
    thread = threading.Thread(
        target=gate.acquire, args=("key", waiter), kwargs={"timeout_s": 30, "other_s": 30}
    )
    thread.start()
    while not woken and gate._waiting == 0:
        time.sleep(0.01)
    gate.release("key", holder)
    thread.join(30)
    assert woken[-1] is True
    assert gate._waiting == 0
    notified: list[int] = []
    gate._cond.notify_all = lambda: notified.append(1)  # type: ignore[method-assign]
    gate.release("key", waiter)
    assert notified == []


def test_another_message_waits_at_most_other_s_for_the_key() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    holder = tracker.register("m1", "a1")
    waiter = tracker.register("m2", "a2")
    assert gate.acquire("key", holder, timeout_s=1, other_s=1) is HELD
    started = time.monotonic()
    assert gate.acquire("key", waiter, timeout_s=30, other_s=0.3) is GateAnswer.TIMEOUT
    assert time.monotonic() - started < 3


def test_a_newer_delivery_of_the_same_message_waits_for_the_running_one() -> None:
    """Adoption: the newer delivery never takes the key from a running older one."""
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    old = tracker.register("m1", "a1", deadline=time.monotonic() + 60)
    assert gate.acquire("key", old, timeout_s=1, other_s=1) is HELD
    new = tracker.register("m1", "a2", deadline=time.monotonic() + 60)
    assert gate.acquire("key", new, timeout_s=0.3, other_s=0.3) is GateAnswer.TIMEOUT
    answers: list[GateAnswer] = []
    thread = threading.Thread(
        target=lambda: answers.append(gate.acquire("key", new, timeout_s=10, other_s=0.1))
    )
    thread.start()
    time.sleep(0.5)  # longer than other_s: an adopter waits its whole time left
    assert answers == []
    gate.release("key", old)
    thread.join(5)
    assert answers == [HELD]


def test_a_holder_past_its_cap_is_passed_over() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    stuck = tracker.register("m1", "a1", deadline=time.monotonic() + 0.3)
    assert gate.acquire("key", stuck, timeout_s=1, other_s=1) is HELD
    newer = tracker.register("m1", "a2")
    started = time.monotonic()
    assert gate.acquire("key", newer, timeout_s=10, other_s=10) is HELD
    assert 0.2 < time.monotonic() - started < 3
    gate.release("key", stuck)  # the abandoned holder's release does not free the new holder
    other = tracker.register("m9", "a9")
    assert gate.acquire("key", other, timeout_s=0.2, other_s=0.2) is GateAnswer.TIMEOUT


def test_waiting_ends_when_the_waiter_is_superseded() -> None:
    tracker = DeliveryTracker()
    gate = KeyGate(tracker)
    holder = tracker.register("m1", "a1")
    waiter = tracker.register("m2", "a2")
    assert gate.acquire("key", holder, timeout_s=1, other_s=1) is HELD
    threading.Timer(0.2, lambda: tracker.register("m2", "a3")).start()
    started = time.monotonic()
    assert gate.acquire("key", waiter, timeout_s=10, other_s=10) is GateAnswer.SUPERSEDED
    assert time.monotonic() - started < 3


def test_draining_wakes_every_waiter() -> None:
    tracker = DeliveryTracker()
    draining = threading.Event()
    gate = KeyGate(tracker, draining)
    holder = tracker.register("m1", "a1")
    waiter = tracker.register("m2", "a2")
    assert gate.acquire("key", holder, timeout_s=1, other_s=1) is HELD
    answers: list[GateAnswer] = []
    thread = threading.Thread(
        target=lambda: answers.append(gate.acquire("key", waiter, timeout_s=30, other_s=30))
    )
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    draining.set()
    gate.wake()
    thread.join(5)
    assert answers == [GateAnswer.DRAINING]
    assert time.monotonic() - started < 0.5  # woken, not at its next poll


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


def test_expired_entries_of_keys_never_seen_again_are_pruned() -> None:
    """Memory follows the recent deferrals: a key that never comes back does not stay."""
    keys = OrderingKeys(expiry_s=60)
    for n in range(1000):
        keys.unfinished(f"k{n}", "m", published=1.0, arrival=n, delay_s=10, now=0)
    assert len(keys) == 1000
    keys.unfinished("fresh", "m", published=1.0, arrival=2000, delay_s=10, now=71)
    assert len(keys) == 1  # k0..k999 were back at 10 s and expired at 70 s, unseen since


def test_protection_never_switches_itself_off() -> None:
    keys = OrderingKeys(expiry_s=60)
    for n in range(200_000):
        keys.unfinished(f"k{n}", "m1", published=1.0, arrival=n, delay_s=10, now=0)
    assert keys.blocked_for("k199999", "m2", published=2.0, arrival=10**6, now=1) == 9
