"""Carrying out the fault schedule on the fleet, its links and the gRPC proxies.

Driven from the orchestrator's main thread (:meth:`Injector.apply` for a
scheduled event, :meth:`Injector.tick` for what a fault undoes later: a
resume, a restart, a heal), so every worker is spawned by the thread its
parent-death signal is tied to. Every applied fault and its undoing is
written to :attr:`Injector.timeline`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from benchmarks.chaos.fleet import Fleet, Worker
from benchmarks.chaos.ledger import ACKNOWLEDGE, MODIFY_ACK_DEADLINE
from benchmarks.chaos.schedule import Fault, FaultEvent

__all__ = ["Injector", "Kill"]

TRANSIENT_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
)
"""Codes of the injected ack/modack errors: all transient for the Pub/Sub client."""

DEFER_S = 15.0
"""How long a kill, pause or partition waits for the fleet to have room for it."""
SETTLE_S = 5.0
"""A worker restarted or resumed this recently is not killed or paused (see ``_target``)."""

_LINKS = {
    Fault.PARTITION_PUBSUB: ("pubsub",),
    Fault.PARTITION_FIRESTORE: ("firestore",),
    Fault.ISOLATE: ("pubsub", "firestore"),
}
_METHOD = {Fault.ACK_ERRORS: ACKNOWLEDGE, Fault.MODACK_ERRORS: MODIFY_ACK_DEADLINE}


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: when (wall clock and run time), which worker, which process."""

    at_wall: float
    at_s: float
    worker: str
    pid: int


class Injector:
    """Applies fault events; schedules and runs their undoing.

    At most ``max_impaired`` workers are down, paused or partitioned at a
    time; a kill, pause or partition beyond that waits up to :data:`DEFER_S`
    for room, then is skipped (and counted). The first event of each kind
    waits as long as the fault phase lasts, so that every kind strikes.
    A fleet with every worker impaired at once makes no progress and tests
    nothing more: jobs can only change hands while some worker is healthy.
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        error_ratio: float,
        max_impaired: int,
        ready: Callable[[Worker], bool] = lambda _worker: True,
    ) -> None:
        self._fleet = fleet
        self._ready = ready
        self._max_impaired = max_impaired
        self._pubsub = [worker.pubsub_proxy for worker in fleet.workers]
        self._firestore = [worker.firestore_proxy for worker in fleet.workers]
        self._error_ratio = error_ratio
        self._pending: list[tuple[float, int, str, Callable[[float], None]]] = []
        self._order = itertools.count()
        self._window_until: dict[Fault, float] = {}
        self._partitioned: set[tuple[str, str]] = set()  # (worker, "pubsub" | "firestore")
        self._restarting: set[str] = set()
        self._deferred: list[tuple[float, FaultEvent]] = []  # (give up at, event)
        self._settled_at: dict[str, float] = {}  # worker -> run time of its last restart/resume
        self.timeline: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.kills: list[Kill] = []

    # -- applying -------------------------------------------------------------------

    def apply(self, event: FaultEvent, now: float) -> None:
        """Carry out ``event`` at run time ``now`` (seconds)."""
        fault = event.fault
        if not fault.per_worker:
            self._open_window(event, now)
            return
        # A first event of its kind goes before any other that waits for room.
        queued = not event.first and self.first_round_waiting
        if fault.impairs and (queued or self.impaired() >= self._max_impaired):
            self._deferred.append((now + DEFER_S, event))
            return
        worker = self._target(event, now)
        if worker is None:
            self.skipped[fault.value] += 1
            self._note(now, fault.value, "skipped: no worker available")
            return
        if fault is Fault.KILL:
            pid = worker.pid or 0
            worker.kill()
            self.kills.append(Kill(time.time(), now, worker.name, pid))
            self._restarting.add(worker.name)
            self._later(now + event.duration_s, f"restart {worker.name}", self._restart(worker))
            self._note(now, fault.value, worker.name, pid=pid, restart_in_s=event.duration_s)
        elif fault is Fault.PAUSE:
            worker.pause()
            self._later(now + event.duration_s, f"resume {worker.name}", self._resume(worker))
            self._note(now, fault.value, worker.name, pid=worker.pid, for_s=event.duration_s)
        elif fault in (Fault.CUT_PUBSUB, Fault.CUT_FIRESTORE):
            link = worker.pubsub_link if fault is Fault.CUT_PUBSUB else worker.firestore_link
            reset = link.cut()
            self._note(now, fault.value, worker.name, connections=reset)
        else:
            self._partition(event, worker, now)
        self.counts[fault.value] += 1

    def tick(self, now: float, *, faulting: bool = True) -> None:
        """Run what is due by run time ``now``; with ``faulting``, deferred faults too."""
        while self._pending and self._pending[0][0] <= now:
            _, _, what, action = heapq.heappop(self._pending)
            action(now)
            self._note(now, "undo", what)
        deferred, self._deferred = self._deferred, []
        deferred.sort(key=lambda item: (not item[1].first, item[1].at_s))
        for deadline, event in deferred:
            if not faulting or (now > deadline and not event.first):
                self.skipped[event.fault.value] += 1
                self._note(now, event.fault.value, "skipped: the fleet stayed impaired")
            else:
                self.apply(event, now)  # deferred again if there is still no room

    def heal_all(self, now: float) -> None:
        """Undo every fault still in effect now (the end of the fault phase)."""
        self._window_until.clear()  # every window closes now, however late it was to end
        while self._pending:
            _, _, what, action = heapq.heappop(self._pending)
            action(now)
            self._note(now, "undo", what)

    @property
    def first_round_waiting(self) -> bool:
        """The first event of some kind is still waiting for room."""
        return any(event.first for _, event in self._deferred)

    def impaired(self) -> int:
        """Workers down, paused or partitioned from an emulator right now."""
        partitioned = {worker for worker, _ in self._partitioned}
        return sum(
            1
            for w in self._fleet.workers
            if w.paused or w.name in self._restarting or w.name in partitioned
        )

    def pubsub_injected(self) -> dict[str, int]:
        """Errors the Pub/Sub proxies injected so far, by full method name."""
        total: Counter[str] = Counter()
        for proxy in self._pubsub:
            total.update(proxy.injected)
        return dict(total)

    @property
    def pending(self) -> bool:
        """Some fault is still in effect (a pause, a partition, a window, a restart)."""
        return bool(self._pending)

    # -- the kinds ------------------------------------------------------------------

    def _target(self, event: FaultEvent, now: float) -> Worker | None:
        """The aimed-at worker if it can take the fault now, else the next one that can.

        One impairment at a time per worker: a kill, pause or partition skips
        a worker that is partitioned already, that has not started pulling
        yet, or that was restarted or resumed less than :data:`SETTLE_S` ago
        (it holds no job yet, or has not touched the jobs it woke up with, so
        the fault would test nothing; and a worker cut off during its
        start-up only fails its start-up checks).
        """
        workers = self._fleet.workers
        for offset in range(len(workers)):
            worker = workers[(event.worker + offset) % len(workers)]
            if not worker.up or worker.paused or worker.name in self._restarting:
                continue
            settling = now - self._settled_at.get(worker.name, -SETTLE_S) < SETTLE_S
            settling = settling or not self._ready(worker)
            partitioned = any(name == worker.name for name, _ in self._partitioned)
            if event.fault.impairs and (settling or partitioned):
                continue
            return worker
        return None

    def _restart(self, worker: Worker) -> Callable[[float], None]:
        def restart(now: float) -> None:
            self._restarting.discard(worker.name)
            self._settled_at[worker.name] = now
            worker.start()

        return restart

    def _resume(self, worker: Worker) -> Callable[[float], None]:
        def resume(now: float) -> None:
            self._settled_at[worker.name] = now
            worker.resume()

        return resume

    def _partition(self, event: FaultEvent, worker: Worker, now: float) -> None:
        names = _LINKS[event.fault]
        links = [
            worker.pubsub_link if name == "pubsub" else worker.firestore_link for name in names
        ]
        for link in links:
            link.blackhole(True)
        if event.fault is Fault.ISOLATE:
            # A host gone from the network: its streaming pull ends at the server (the
            # reconnect it tries is held by the partition), so redeliveries go elsewhere.
            worker.pubsub_link.cut()
        self._partitioned.update((worker.name, name) for name in names)

        def heal(_now: float) -> None:
            for link in links:
                if event.reset_on_heal:
                    link.cut()  # what the partition held is lost
                link.blackhole(False)
            self._partitioned.difference_update((worker.name, name) for name in names)

        how = "reset" if event.reset_on_heal else "deliver"
        what = "+".join(names)
        self._later(now + event.duration_s, f"heal {what} of {worker.name} ({how})", heal)
        self._note(now, event.fault.value, worker.name, for_s=event.duration_s, heal=how)

    def _open_window(self, event: FaultEvent, now: float) -> None:
        fault = event.fault
        until = max(self._window_until.get(fault, 0.0), now + event.duration_s)
        self._window_until[fault] = until
        if fault is Fault.SLOW_FIRESTORE:
            low, high = event.latency_ms
            for proxy in self._firestore:
                proxy.delay(low / 1000, high / 1000)
            detail: dict[str, Any] = {"latency_ms": list(event.latency_ms)}
        else:
            for proxy in self._pubsub:
                proxy.fail({_METHOD[fault]: self._error_ratio}, codes=TRANSIENT_CODES)
            detail = {"ratio": self._error_ratio}

        def close(at: float) -> None:
            if self._window_until.get(fault, 0.0) > at:
                return  # a later window of the same kind is still open
            self._window_until.pop(fault, None)
            for proxy in self._firestore if fault is Fault.SLOW_FIRESTORE else self._pubsub:
                if fault is Fault.SLOW_FIRESTORE:
                    proxy.delay(0.0, 0.0)
                else:
                    proxy.heal((_METHOD[fault],))

        self._later(until, f"close {fault.value}", close)
        self.counts[fault.value] += 1
        self._note(now, fault.value, "fleet", for_s=event.duration_s, **detail)

    # -- bookkeeping ------------------------------------------------------------------

    def _later(self, at: float, what: str, action: Callable[[float], None]) -> None:
        heapq.heappush(self._pending, (at, next(self._order), what, action))

    def _note(self, now: float, what: str, target: str, **detail: Any) -> None:
        self.timeline.append({"t_s": round(now, 2), "fault": what, "target": target, **detail})
