"""The seeded fault schedule: which fault, when, on which worker, for how long.

Pure: the same seed, rates, fleet size and lease give the same schedule.
Each fault kind draws from its own random stream (seeded by the run's seed
and the kind's name), so switching one kind off or changing its rate leaves
the others' events where they were.

Each enabled kind gets a first event early, within :data:`FIRST_ROUND_S`
of the start (a short run must see every kind while work remains), then
events at exponential gaps of mean ``60 / rate`` seconds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "DEFAULT_RATES",
    "FIRST_ROUND_S",
    "SHORT_RATES",
    "Fault",
    "FaultEvent",
    "build_schedule",
    "parse_rates",
]

LONG_PARTITION_SHARE = 0.6
"""Share of one-link partitions that outlast the lease (the others last 2 to 8 s)."""

FIRST_ROUND_S = 15.0
"""Every enabled kind strikes once within this many seconds of the start."""


class Fault(str, Enum):
    """The kinds of fault the run injects."""

    KILL = "kill"
    """SIGKILL a worker; a new one starts in its place after ``duration_s``."""
    PAUSE = "pause"
    """SIGSTOP a worker for ``duration_s`` (past its lease), then SIGCONT."""
    CUT_PUBSUB = "cut-pubsub"
    """Reset every connection of one worker to Pub/Sub (it reconnects)."""
    CUT_FIRESTORE = "cut-firestore"
    """Reset every connection of one worker to Firestore (it reconnects)."""
    PARTITION_PUBSUB = "partition-pubsub"
    """Blackhole one worker's Pub/Sub connection for ``duration_s`` (often past the lease)."""
    PARTITION_FIRESTORE = "partition-firestore"
    """Blackhole one worker's Firestore connection for ``duration_s`` (often past the lease)."""
    ISOLATE = "isolate"
    """Cut one worker from the network past the lease: both connections blackholed."""
    ACK_ERRORS = "ack-errors"
    """For ``duration_s``, a fraction of all acks fail with a transient gRPC error."""
    MODACK_ERRORS = "modack-errors"
    """For ``duration_s``, a fraction of all lease modacks (and nacks) fail likewise."""
    SLOW_FIRESTORE = "slow-firestore"
    """For ``duration_s``, every Firestore call of the fleet waits ``latency_ms`` first."""

    @property
    def impairs(self) -> bool:
        """Whether the fault takes a worker out for a while (down, frozen, partitioned)."""
        return self in _IMPAIRING

    @property
    def per_worker(self) -> bool:
        """Whether the fault hits one worker (else the whole fleet)."""
        return self not in (Fault.ACK_ERRORS, Fault.MODACK_ERRORS, Fault.SLOW_FIRESTORE)


_IMPAIRING = frozenset(
    (Fault.KILL, Fault.PAUSE, Fault.PARTITION_PUBSUB, Fault.PARTITION_FIRESTORE, Fault.ISOLATE)
)

DEFAULT_RATES: Mapping[Fault, float] = {
    Fault.KILL: 4.0,
    Fault.PAUSE: 2.0,
    Fault.CUT_PUBSUB: 2.0,
    Fault.CUT_FIRESTORE: 2.0,
    Fault.PARTITION_PUBSUB: 1.0,
    Fault.PARTITION_FIRESTORE: 1.0,
    Fault.ISOLATE: 2.0,
    Fault.ACK_ERRORS: 1.5,
    Fault.MODACK_ERRORS: 1.5,
    Fault.SLOW_FIRESTORE: 1.0,
}
"""Events per minute of each kind while work remains."""

SHORT_RATES: Mapping[Fault, float] = {
    **DEFAULT_RATES,
    Fault.KILL: 6.0,
    Fault.PAUSE: 6.0,
    Fault.PARTITION_PUBSUB: 2.0,
    Fault.PARTITION_FIRESTORE: 2.0,
    Fault.ISOLATE: 6.0,
    Fault.ACK_ERRORS: 3.0,
    Fault.MODACK_ERRORS: 3.0,
    Fault.SLOW_FIRESTORE: 2.0,
}
"""The short run's rates: its fault phase lasts under a minute."""


@dataclass(frozen=True)
class FaultEvent:
    """One scheduled fault.

    Attributes:
        at_s: Seconds after the start of the fault phase.
        fault: What happens.
        worker: Index of the worker it is aimed at (per-worker kinds); when
            that worker is down or paused then, the next one up is taken.
        duration_s: How long it lasts (restart delay for a kill; 0 for a cut).
        reset_on_heal: A partition heals with a reset (held bytes lost) rather
            than by delivering what it held.
        latency_ms: Range of the added latency (slow Firestore).
    """

    at_s: float
    fault: Fault
    worker: int
    duration_s: float
    reset_on_heal: bool = False
    latency_ms: tuple[int, int] = (0, 0)
    first: bool = False
    """The first event of its kind: it waits for room however long it takes (see injector)."""


def parse_rates(
    specs: list[str], off: list[str], *, base: Mapping[Fault, float] = DEFAULT_RATES
) -> dict[Fault, float]:
    """Rates from ``KIND=PER_MINUTE`` specs and kinds switched off (``all`` for every kind).

    Raises:
        ValueError: An unknown kind or a rate that is not a number >= 0.
    """
    rates = dict(base)
    names = {fault.value: fault for fault in Fault}

    def kind(name: str) -> Fault:
        if name not in names:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(names)})")
        return names[name]

    for name in off:
        if name == "all":
            rates = dict.fromkeys(Fault, 0.0)
        else:
            rates[kind(name)] = 0.0
    for spec in specs:
        name, sep, value = spec.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not sep or rate < 0:
            raise ValueError(f"--rate {spec!r}: expected KIND=EVENTS_PER_MINUTE, e.g. kill=4")
        rates[kind(name)] = rate
    return rates


def build_schedule(
    seed: int,
    rates: Mapping[Fault, float],
    *,
    workers: int,
    horizon_s: float,
    lease_s: float,
) -> list[FaultEvent]:
    """Every fault event within ``horizon_s``, in time order."""
    events: list[FaultEvent] = []
    for fault in Fault:
        rate = rates.get(fault, 0.0)
        if rate <= 0:
            continue
        rng = random.Random(f"{seed}:{fault.value}")
        at = rng.uniform(1.0, FIRST_ROUND_S)
        first = True
        while at < horizon_s:
            events.append(
                dataclasses.replace(_event(rng, fault, at, workers, lease_s), first=first)
            )
            first = False
            at += rng.expovariate(rate / 60.0)
    events.sort(key=lambda event: (event.at_s, event.fault.value))
    return events


def _event(rng: random.Random, fault: Fault, at: float, workers: int, lease_s: float) -> FaultEvent:
    worker = rng.randrange(workers)
    if fault is Fault.KILL:
        return FaultEvent(at, fault, worker, duration_s=rng.uniform(0.5, 3.0))
    if fault is Fault.PAUSE:
        # Past the lease, so that the job is redelivered and claimed by another worker
        # while this one is frozen; the stale owner then wakes up mid-step.
        return FaultEvent(at, fault, worker, duration_s=lease_s + rng.uniform(2.0, 8.0))
    if fault in (Fault.CUT_PUBSUB, Fault.CUT_FIRESTORE):
        return FaultEvent(at, fault, worker, duration_s=0.0)
    if fault in (Fault.PARTITION_PUBSUB, Fault.PARTITION_FIRESTORE, Fault.ISOLATE):
        # Short ones test the retries of a call; long ones outlast the lease: the job is
        # claimed by another worker while the cut-off one still has a write to make,
        # which only the version precondition of that write can stop. An isolated
        # worker is always cut off that long.
        long = fault is Fault.ISOLATE or rng.random() < LONG_PARTITION_SHARE
        duration = lease_s + rng.uniform(4.0, 10.0) if long else rng.uniform(2.0, 8.0)
        return FaultEvent(at, fault, worker, duration_s=duration, reset_on_heal=rng.random() < 0.5)
    if fault is Fault.SLOW_FIRESTORE:
        high = rng.randint(200, 1000)
        return FaultEvent(
            at, fault, -1, duration_s=rng.uniform(5.0, 15.0), latency_ms=(high // 4, high)
        )
    return FaultEvent(at, fault, -1, duration_s=rng.uniform(5.0, 15.0))
