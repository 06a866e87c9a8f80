"""Delivery generations and the per-key turnstile of one process.

Pub/Sub (with exactly-once delivery) only lets the *latest* ack ID of a
message acknowledge it. :class:`DeliveryTracker` remembers, per message id,
the latest delivery this process has seen. A newer delivery of a message
whose older delivery is running here *adopts* it: the older one goes on (it
owns the job in the store) but never settles on Pub/Sub; the newer one waits
for it at the :class:`KeyGate` and then settles from the job's record. It
takes the key over without waiting only once the older one is past its
processing cap (as another process would, the claim then waits for the
store's lease). :class:`KeyGate` lets one delivery per job key run at a time
in this process; another message with the same key waits its turn.
:class:`OrderingKeys` keeps the messages of one ordering key in publish
order when one of them is deferred or released.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import math
import threading
import time
from dataclasses import dataclass

from pubsub_worker._support import fences

__all__ = ["Delivery", "DeliveryTracker", "GateAnswer", "KeyGate", "OrderingKeys"]


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
    deadline: float = math.inf
    """``time.monotonic()`` when its processing cap passes (receipt + cap)."""
    lost: bool = False
    """This delivery no longer owns the message (see :attr:`lost_why`); set once, by
    :meth:`give_up`, from any thread (one attribute: read and written atomically)."""
    lost_why: str = ""
    """Why: Pub/Sub refused the ack id, or the lease was given up for lack of progress."""
    follows: bool = False
    """Another delivery of its message was in flight in this process when it arrived: a
    redelivery, whatever its delivery attempt says."""
    successor: Delivery | None = None
    """A newer delivery of the same message in this process: it settles the message, this one
    never does (its ack id is stale); it waits for this one while it runs."""

    def give_up(self, why: str) -> None:
        """Mark this delivery lost; the first reason given is kept."""
        if not self.lost:
            self.lost_why = why  # before the flag: whoever sees it lost finds the reason
            self.lost = True

    def time_left_s(self, now: float | None = None) -> float:
        """Seconds until its processing cap passes (negative past it)."""
        return self.deadline - (time.monotonic() if now is None else now)

    def past_cap(self, now: float | None = None) -> bool:
        """Its processing cap passed: the process no longer waits for it."""
        return self.time_left_s(now) <= 0


class DeliveryTracker:
    """Per message id, the latest delivery seen by this process. Thread-safe."""

    def __init__(self) -> None:
        # A worker builds its one tracker as it starts: where a fence switched off for a test
        # is announced, or refused outside the emulators.
        fences.check()
        self._lock = threading.Lock()  # guards _latest and _running
        self._latest: dict[str, Delivery] = {}
        self._running: dict[str, Delivery] = {}  # digest -> every delivery in flight
        self._generations = itertools.count(1)

    def register(self, message_id: str, ack_id: str, *, deadline: float = math.inf) -> Delivery:
        """Record a new delivery: the latest of its message, the successor of the one before."""
        delivery = Delivery(
            message_id=message_id,
            ack_id=ack_id,
            generation=next(self._generations),
            digest=ack_digest(ack_id),
            deadline=deadline,
        )
        with self._lock:
            previous = self._latest.get(message_id)
            if previous is not None:
                previous.successor = delivery
                delivery.follows = True
            self._latest[message_id] = delivery
            self._running[delivery.digest] = delivery
        return delivery

    def is_current(self, delivery: Delivery) -> bool:
        """True while ``delivery`` is the latest one of its message and not known lost.

        Only a current delivery settles on Pub/Sub (acks, nacks, defers); this
        is the ``generation`` fence (:mod:`pubsub_worker._support.fences`).
        """
        if "generation" in fences.OFF:
            return True  # switched off in a test: a superseded delivery goes on and settles
        if delivery.lost:
            return False
        with self._lock:
            return self._latest.get(delivery.message_id) is delivery

    @staticmethod
    def owns(delivery: Delivery) -> bool:
        """The delivery may go on with its job: not lost (a newer delivery here adopts it)."""
        return "generation" in fences.OFF or not delivery.lost

    def abandoned(self, message_id: str, digest: str, now: float | None = None) -> bool:
        """This process holds the delivery ``digest`` of ``message_id``, past its cap.

        A claim may take over a live lease held by such a delivery: its job is
        stopping, and it is the only one that could still write.
        """
        with self._lock:
            delivery = self._running.get(digest)
        if delivery is None or delivery.message_id != message_id:
            return False
        return "adoption" in fences.OFF or delivery.past_cap(now)

    def forget(self, delivery: Delivery) -> None:
        """Drop ``delivery`` once it ended; it stays the latest only while no newer one exists."""
        with self._lock:
            self._running.pop(delivery.digest, None)
            if self._latest.get(delivery.message_id) is delivery:
                del self._latest[delivery.message_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._latest)


class GateAnswer(enum.Enum):
    """How a wait at the :class:`KeyGate` ended."""

    HELD = "held"
    """The delivery holds the key."""
    SUPERSEDED = "superseded"
    """A newer delivery of its message arrived, or it was lost: it stands down."""
    TIMEOUT = "timeout"
    """The key stayed busy until the delivery's wait ended (its time left, or a lease)."""
    DRAINING = "draining"
    """The worker stops taking jobs."""


class KeyGate:
    """One holder per job key in this process; others wait their turn.

    A newer delivery of the holder's own message waits too (it adopts the
    running delivery and settles from its record); only a holder past its
    processing cap is passed over at once. :meth:`wake` ends every wait
    early to look at the draining flag again.
    """

    def __init__(self, tracker: DeliveryTracker, draining: threading.Event | None = None) -> None:
        self._tracker = tracker
        self._draining = draining or threading.Event()
        # The lock is taken directly: a Condition's with-statement is two Python calls, and
        # every delivery takes it twice.
        self._lock = threading.Lock()  # guards _holders
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # deliveries waiting for a key: a release without any notifies none
        self._holders: dict[str, Delivery] = {}

    def acquire(
        self, key: str, delivery: Delivery, *, timeout_s: float, other_s: float
    ) -> GateAnswer:
        """Become the holder of ``key``; otherwise why not.

        Waits at most ``timeout_s`` for an older delivery of the same message
        (its adopter waits for it), and at most ``other_s`` of that for another
        message's delivery.
        """
        start = now = time.monotonic()
        with self._lock:
            while True:
                if not self._tracker.is_current(delivery):
                    return GateAnswer.SUPERSEDED
                if self._draining.is_set():
                    return GateAnswer.DRAINING
                holder = self._holders.get(key)
                if holder is None or self._passed_over(holder, delivery, now):
                    self._holders[key] = delivery
                    return GateAnswer.HELD
                adopting = holder.message_id == delivery.message_id
                limit = timeout_s if adopting else min(timeout_s, other_s)
                remaining = start + limit - now
                if remaining <= 0:
                    return GateAnswer.TIMEOUT
                self._waiting += 1
                try:
                    self._cond.wait(min(remaining, 1.0, max(holder.time_left_s(now), 0.01)))
                finally:
                    self._waiting -= 1
                now = time.monotonic()

    @staticmethod
    def _passed_over(holder: Delivery, delivery: Delivery, now: float) -> bool:
        if holder.past_cap(now):
            return True  # abandoned: the claim will wait for its lease as another process would
        same_message = holder.message_id == delivery.message_id
        return same_message and "adoption" in fences.OFF and holder.generation < delivery.generation

    def release(self, key: str, delivery: Delivery) -> None:
        """Give ``key`` up, if ``delivery`` still holds it."""
        with self._lock:
            if self._holders.get(key) is delivery:
                del self._holders[key]
                if self._waiting:
                    self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiter (the worker started draining)."""
        with self._cond:
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._lock:
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
    to another worker), so a key is never blocked for good; expired entries
    of every key are pruned together at least once per ``expiry_s``, so
    memory follows the deferrals of the last ``expiry_s`` whatever keys come
    back (there is no count at which protection stops).

    A push endpoint does not use it: Pub/Sub pushes the next message of a
    key only once the previous one was answered with a 2xx.
    """

    def __init__(self, *, expiry_s: float) -> None:
        self._expiry_s = expiry_s
        self._lock = threading.Lock()  # guards _keys, _count and _next_sweep
        self._keys: dict[str, dict[str, _Unfinished]] = {}
        self._count = 0
        self._next_sweep = -math.inf  # the first call sweeps (nothing) and sets the next
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
            self._sweep(now)
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
            self._sweep(now)
            entries = self._prune(key, now)
            own = entries.get(message_id)
            if own is None:
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

    def _sweep(self, now: float) -> None:
        """Prune every key's expired entries, once per ``expiry_s`` (amortised: O(1) a call)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._expiry_s
        for key in list(self._keys):
            self._prune(key, now)

    def _prune(self, key: str, now: float) -> dict[str, _Unfinished]:
        entries = self._keys.get(key, {})
        stale = [m for m, entry in entries.items() if entry.back_at + self._expiry_s <= now]
        for message_id in stale:
            del entries[message_id]
            self._count -= 1
        if not entries:
            self._keys.pop(key, None)
        return entries
