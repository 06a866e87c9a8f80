"""Delivery generations and the per-key turnstile of one process.

Pub/Sub (with exactly-once delivery) only lets the *latest* ack ID of a
message acknowledge it. :class:`DeliveryTracker` remembers, per message id,
the latest delivery this process has seen; a callback running on an older
one is *superseded* and stops at its next step boundary. :class:`KeyGate`
lets one callback per job key run at a time in this process: a second
message with the same key waits its turn, while a newer delivery of the
*same* message takes over at once (the older one can no longer ack).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Delivery", "DeliveryTracker", "KeyGate"]


def ack_digest(ack_id: str) -> str:
    """A short, stable digest of an ack ID (ack IDs are long and opaque)."""
    return hashlib.sha256(ack_id.encode()).hexdigest()[:32]


@dataclass(eq=False)
class Delivery:
    """One delivery of one message to this process."""

    message_id: str
    ack_id: str
    generation: int
    digest: str
    lost: threading.Event = field(default_factory=threading.Event)
    """Set when this delivery no longer owns the message (see :attr:`lost_why`)."""
    lost_why: str = ""
    """Why: Pub/Sub refused the ack id, or the lease was given up for lack of progress."""

    def give_up(self, why: str) -> None:
        """Mark this delivery lost; the first reason given is kept."""
        if not self.lost.is_set():
            self.lost_why = why
            self.lost.set()


class DeliveryTracker:
    """Per message id, the latest delivery seen by this process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _latest
        self._latest: dict[str, Delivery] = {}
        self._generations = itertools.count(1)

    def register(self, message_id: str, ack_id: str) -> Delivery:
        """Record a new delivery; it supersedes every earlier delivery of the message."""
        delivery = Delivery(
            message_id=message_id,
            ack_id=ack_id,
            generation=next(self._generations),
            digest=ack_digest(ack_id),
        )
        with self._lock:
            self._latest[message_id] = delivery
        return delivery

    def seen(self, message_id: str) -> bool:
        """Whether a delivery of this message is in flight in this process."""
        with self._lock:
            return message_id in self._latest

    def is_current(self, delivery: Delivery) -> bool:
        """True while ``delivery`` is the latest one of its message and not known lost."""
        if delivery.lost.is_set():
            return False
        with self._lock:
            return self._latest.get(delivery.message_id) is delivery

    def superseded(self, message_id: str, digest: str) -> bool:
        """True when this process holds a newer delivery than the one with ``digest``."""
        with self._lock:
            latest = self._latest.get(message_id)
        return latest is not None and latest.digest != digest

    def forget(self, delivery: Delivery) -> None:
        """Drop ``delivery`` once its callback ended, unless a newer one replaced it."""
        with self._lock:
            if self._latest.get(delivery.message_id) is delivery:
                del self._latest[delivery.message_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._latest)


class KeyGate:
    """One holder per job key in this process; others wait their turn.

    A newer delivery of the holder's own message does not wait: the holder
    is superseded (it cannot ack any more) and stops at its next boundary.
    """

    def __init__(self, tracker: DeliveryTracker) -> None:
        self._tracker = tracker
        self._cond = threading.Condition()  # guards _holders
        self._holders: dict[str, Delivery] = {}

    def acquire(self, key: str, delivery: Delivery, *, timeout_s: float) -> bool:
        """Become the holder of ``key``; False on timeout or when ``delivery`` was superseded."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                holder = self._holders.get(key)
                if holder is None or (
                    holder.message_id == delivery.message_id
                    and holder.generation < delivery.generation
                ):
                    self._holders[key] = delivery
                    return True
                if not self._tracker.is_current(delivery):
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 1.0))

    def release(self, key: str, delivery: Delivery) -> None:
        """Give ``key`` up, if ``delivery`` still holds it."""
        with self._cond:
            if self._holders.get(key) is delivery:
                del self._holders[key]
                self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._holders)
