"""Delivery generations and the per-key turnstile of one process.

Pub/Sub (with exactly-once delivery) only lets the *latest* ack ID of a
message acknowledge it. :class:`DeliveryTracker` remembers, per message id,
the latest delivery this process has seen; a callback running on an older
one is *superseded* and stops at its next step boundary. :class:`KeyGate`
lets one callback per job key run at a time in this process: a second
message with the same key waits its turn, while a newer delivery of the
*same* message takes over at once (the older one can no longer ack).
:class:`OrderingKeys` keeps the messages of one ordering key in publish
order when one of them is deferred or released.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from dataclasses import dataclass, field

from pubsub_worker._support import fences

__all__ = ["Delivery", "DeliveryTracker", "KeyGate", "OrderingKeys"]


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
        # A worker builds its one tracker as it starts: where a fence switched off for a test
        # is announced, or refused outside the emulators.
        fences.check()
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
        """True while ``delivery`` is the latest one of its message and not known lost.

        This is the ``generation`` fence (:mod:`pubsub_worker._support.fences`).
        """
        if fences.off("generation"):
            return True  # switched off in a test: a superseded delivery goes on and settles
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


@dataclass
class _Unfinished:
    published: float
    """The message's publish time (seconds since the epoch): what "earlier" means in a key."""
    arrival: int
    """Its first arrival here, in this process's order: breaks ties of publish time (messages of
    one publish request can share it), as the client hands a key's messages out in order."""
    back_at: float
    """``time.monotonic()`` when the message is expected back (its deferral ends)."""


class OrderingKeys:
    """Per ordering key, the messages of this process that ended without being done. Thread-safe.

    With message ordering, the client hands a worker the next message of a key
    only once the previous one is acked, nacked or dropped, and Pub/Sub
    redelivers a message that is not acked together with the ones published
    after it. A message deferred (dropped with a deadline: a busy owner, a store
    briefly down) or released lets the next one of its key through before it
    comes back. So a message of a key is held back (deferred too) while an
    *earlier* message of the same key is unfinished here (earlier: published
    before it, or at the same time and received here first); a
    completed, acked or reviewed message finishes. An entry expires
    ``expiry_s`` after its message was expected back (it may have come back
    to another worker), so a key is never blocked for good.
    """

    MAX_ENTRIES = 100_000

    def __init__(self, *, expiry_s: float) -> None:
        self._expiry_s = expiry_s
        self._lock = threading.Lock()  # guards _keys and _count
        self._keys: dict[str, dict[str, _Unfinished]] = {}
        self._count = 0
        self._arrivals = itertools.count(1)

    def arrival(self) -> int:
        """A number for a message received now: later arrivals get larger numbers."""
        return next(self._arrivals)

    def blocked_for(
        self,
        key: str,
        message_id: str,
        published: float,
        arrival: int,
        now: float | None = None,
    ) -> float | None:
        """Seconds until an earlier unfinished message of ``key`` is back; None if none is.

        ``arrival`` (from :meth:`arrival`) orders messages published at the same time; a
        message already unfinished here keeps its first arrival.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            entries = self._prune(key, now)
            own = entries.get(message_id)
            mine = (published, own.arrival if own is not None else arrival)
            waits = [
                entry.back_at - now
                for other, entry in entries.items()
                if other != message_id and (entry.published, entry.arrival) < mine
            ]
        return max(*waits, 0.0) if waits else None

    def unfinished(
        self,
        key: str,
        message_id: str,
        published: float,
        arrival: int,
        delay_s: float,
        now: float | None = None,
    ) -> None:
        """``message_id`` of ``key`` ended without being done; it is back in ``delay_s``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entries = self._prune(key, now)
            own = entries.get(message_id)
            if own is None:
                if self._count >= self.MAX_ENTRIES:
                    return  # bounded memory: past this, later messages are not held back
                self._count += 1
            else:
                arrival = own.arrival  # its first arrival stays its place in the key
            entries[message_id] = _Unfinished(published, arrival, now + delay_s)
            self._keys[key] = entries

    def finished(self, key: str, message_id: str) -> None:
        """``message_id`` of ``key`` is done (completed, acked or reviewed)."""
        with self._lock:
            entries = self._keys.get(key)
            if entries is not None and entries.pop(message_id, None) is not None:
                self._count -= 1
                if not entries:
                    del self._keys[key]

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def _prune(self, key: str, now: float) -> dict[str, _Unfinished]:
        entries = self._keys.get(key, {})
        stale = [m for m, entry in entries.items() if entry.back_at + self._expiry_s <= now]
        for message_id in stale:
            del entries[message_id]
            self._count -= 1
        if not entries:
            self._keys.pop(key, None)
        return entries
