"""The batch slots of a write batcher: when the next ``BatchWrite`` may go.

:class:`Slots` counts the batches in flight and says whether another may
go now, when a slow slot opens, and how long a batch is held open for the
writes of other jobs. It keeps no lock of its own: the batcher's
(:mod:`pubsub_worker.stores._batcher`) guards it.

Long round trips are not left to add up. A write need not wait a whole one for a
slot: once the youngest batch in flight has been out ``slow_after_s`` (5 ms),
one more batch may go, up to ``slow_in_flight`` (4) in all; while round trips
are long (their moving average at least ``slow_after_s``, and the latest too),
once it has been out ``long_wait_s`` (1 ms), unless a job in flight has no write
out yet and may add one to the batch (then the batch waits for it, as under a
backlog). And while round trips are long (their moving average) and no batch is
in flight, a batch is held open up to ``gather_s`` (2 ms) while some job in
flight in the worker (``writers``, set by the worker) has no write out yet; a
batch with a claim that finds none waits a glance (a quarter of that) for a
callback about to start, unless the worker knows none is (``arriving``: under
``run()``, whose scheduler reports each message as it is received, none waits
for a thread). The jobs of one pull response then claim, and complete, in one
RPC, so their acks reach the client's dispatcher together instead of each behind
the other's round trip. On loopback an RPC is answered sooner: the slow slots
mostly stay shut and nothing is held open.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Slots"]

_WEIGHT = 0.2
"""The weight of the latest round trip in the moving average."""
_GLANCE = 0.25
"""The share of ``gather_s`` a batch is held open when no other job could add to it yet."""


class Slots:
    """Batches in flight, at most ``max_in_flight``, up to ``slow_in_flight`` while slow.

    ``long_wait_s``: while round trips are long (their moving average and the
    latest at least ``slow_after_s``) and no job in flight may add a write, the
    wait for a slow slot (:meth:`slow_opens_in`).
    ``gather_s``: while round trips are long and no batch is in flight, a
    batch is held open up to this long for the writes of the other jobs
    :attr:`writers` counts (0: never; :meth:`hold_for`).
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        slow_in_flight: int,
        slow_after_s: float,
        gather_s: float,
        long_wait_s: float = 0.001,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if slow_after_s <= 0:
            raise ValueError("slow_after_s must be above 0")
        if long_wait_s <= 0:
            raise ValueError("long_wait_s must be above 0")
        if gather_s < 0:
            raise ValueError("gather_s must be 0 or more")
        self._max_in_flight = max_in_flight
        self.most = max(slow_in_flight, max_in_flight)
        """The most batches in flight at once (and the most flushers)."""
        self._slow_after_s = slow_after_s
        self._long_wait_s = long_wait_s
        self._gather_s = gather_s
        self.sending = 0
        """Batches in flight."""
        self._last_sent = 0.0  # monotonic time the youngest batch in flight was sent
        self.round_trip_s = 0.0
        """Moving average of the batches' round trips, seconds (0 before the first)."""
        self._latest_s = 0.0  # the latest answered batch's round trip
        self.writers: Callable[[], int] | None = None
        """Jobs in flight in the worker (set by it); None: unknown, nothing is held open."""
        self.arriving: Callable[[], int | None] | None = None
        """Messages received and waiting for a callback thread, each to bring a claim (set
        by a worker whose scheduler reports receipts); None, or None from it: unknown."""

    def take(self, now: float) -> None:
        """A batch goes."""
        self.sending += 1
        self._last_sent = now

    def give_back(self, round_trip_s: float | None) -> None:
        """A batch is done; ``round_trip_s``: how long it took, when it was answered."""
        self.sending -= 1
        if round_trip_s is not None:
            self._latest_s = round_trip_s
            average = self.round_trip_s
            self.round_trip_s = (
                round_trip_s if not average else average + _WEIGHT * (round_trip_s - average)
            )

    def free(self, now: float, writing: int | None = None) -> bool:
        """A batch may go now: a slot is free, or a slow one open (``writing``: as for
        :meth:`slow_opens_in`)."""
        return self.sending < self._max_in_flight or self.slow_opens_in(now, writing) == 0.0

    def slow_opens_in(self, now: float, writing: int | None = None) -> float | None:
        """Seconds until a slow slot opens (0.0: open now); None: none will, as things are.

        Past ``max_in_flight``, another batch may go once the youngest batch in
        flight has been out ``slow_after_s``, or ``long_wait_s`` while round
        trips are long (their moving average and the latest at least
        ``slow_after_s``): a write waits that long for a slot, not a whole round
        trip. On loopback a batch is mostly answered before either, and one slow
        answer (an emulator's pause) lifts the average but not the latest. Not
        ``long_wait_s`` while some job in flight (:attr:`writers`) has no write
        queued or in flight (``writing`` jobs have one): it may add one to the
        batch, which then waits ``slow_after_s`` for it; under a backlog the
        writes keep gathering as many per batch. None: unknown, not waited for.
        """
        if not self._max_in_flight <= self.sending < self.most:
            return None
        slow = self._slow_after_s
        long = self.round_trip_s >= slow and self._latest_s >= slow
        if long and writing is not None and self.writers is not None:
            long = self.writers() <= writing  # no job in flight left to add a write
        return max(self._last_sent + (self._long_wait_s if long else slow) - now, 0.0)

    def hold_for(self, queued_at: float, now: float, *, writing: int, claims: bool) -> float | None:
        """Seconds to hold open a batch whose oldest write was queued at ``queued_at``.

        None: send it now. Held only while round trips are long and no batch
        is in flight (one in flight gathers the writes behind it already), at
        most ``gather_s`` from its oldest write, while some job in flight has
        no write queued or in flight (``writing`` of them have one) and so
        may bring one. A batch with a job's first write (``claims``) that
        finds no such job still waits a glance (a quarter of ``gather_s``):
        the callbacks of the same pull response start one after another,
        each once the thread before it blocks. Not when the worker knows no
        callback is about to start (:attr:`arriving` says none waits for a
        thread). A batch of later writes only (completions) does not: a
        callback about to start would bring a claim, which gains nothing
        from riding with them.
        """
        writers = self.writers
        if not self._gather_s or writers is None or self.sending:
            return None
        if self.round_trip_s < self._slow_after_s:
            return None
        if writers() > writing:
            left = queued_at + self._gather_s - now
        elif claims and self._may_start():
            left = queued_at + self._gather_s * _GLANCE - now
        else:
            return None
        return left if left > 0 else None

    def _may_start(self) -> bool:
        """A callback may start soon: the worker cannot tell, or a message waits for one."""
        arriving = self.arriving
        waiting = arriving() if arriving is not None else None
        return waiting is None or waiting > 0
