"""The scenarios a benchmark run compares, all on the same emulators.

A scenario is one consumer configuration: which callback (the stock client's
or the wrapper's), how it subscribes (the session's fixed flow control, the
client's defaults, or :func:`pubsub_worker.run`), how many processes share
the subscription and how large the payload is. Each wrapped scenario names
its *baseline*, the stock scenario with the same subscriber setup: ratios
are taken against it, within each repeat.

Groups (``--scenarios core,fleet``) select families; see :data:`GROUPS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pubsub_worker.settings import Settings

__all__ = [
    "BASELINE",
    "DEFAULT_SCENARIOS",
    "GROUPS",
    "SCENARIOS",
    "Kind",
    "Scenario",
    "Subscribe",
    "expand",
]

_RUN_THREADS: int = Settings.model_fields["max_messages"].default
"""``run()``'s callback threads by default (``PUBSUB_WORKER_MAX_MESSAGES``)."""

Kind = Literal["stock-ack", "stock-eod", "wrapped", "legacy", "run"]
"""``stock-ack``: ``message.ack()``; ``stock-eod``: awaited ``ack_with_response()``;
``wrapped``: ``exactly_once(handler(message, job))`` with ``steps`` steps;
``legacy``: ``exactly_once`` around the unchanged ``stock-eod`` callback (the one
added line); ``run``: :func:`pubsub_worker.run` with its defaults."""

Subscribe = Literal["fixed", "default", "run"]
"""``fixed``: ``FlowControl(max_messages=C)`` and a ``ThreadScheduler`` of ``C``
threads; ``default``: plain ``subscriber.subscribe(path, callback=...)``, nothing
else passed (1,000 messages, 100 MiB outstanding, 10 threads); ``run``: what
:func:`pubsub_worker.run` sets up (``MAX_MESSAGES`` = 20 threads by default, and
as many messages prefetched: 40 in flow control)."""

StoreKind = Literal["default", "direct", "batched", "memory"]


@dataclass(frozen=True)
class Scenario:
    """One consumer configuration."""

    name: str
    kind: Kind
    label: str
    """How the report names it."""
    baseline: str = "stock-eod"
    """The stock scenario with the same setup; the ratio is against it."""
    eod: bool = True
    """The subscription has exactly-once delivery."""
    steps: int = 0
    """Steps of the wrapped handler."""
    subscribe: Subscribe = "fixed"
    concurrency: int | None = None
    """Flow control ``max_messages`` and threads for ``fixed``; None: ``--concurrency``."""
    processes: int = 1
    """Consumer processes on the one subscription (the fleet's throughput is measured); each
    gets a lone consumer's backlog (:func:`benchmarks.run.scenario_backlog`)."""
    payload_bytes: int | None = None
    """None: the session's payload (256 bytes)."""
    backlog_share: float = 1.0
    """The backlog is this share of ``--messages`` (large payloads take fewer)."""
    latency: bool = False
    """Also run the paced (latency) and lone-message phases."""
    store: StoreKind = "default"
    """``default``: what ``exactly_once`` builds; ``direct``: one RPC per write;
    ``batched``: concurrent writes coalesced into BatchWrite RPCs, tuned by ``batching``;
    ``memory``: :class:`~pubsub_worker.stores.memory.MemoryJobStore`, no Firestore at all:
    the wrapper's own cost, with the store's round trips taken out."""
    batching: Mapping[str, Any] = field(default_factory=dict)
    """Options of ``BatchingFirestoreJobStore`` for ``store="batched"``."""
    asynchronous: bool = False
    """The wrapped handler is ``async def`` and awaits its steps (``await job.step``)."""
    step_io_ms: float = 0.0
    """Each step waits this long, as for a call to another service: ``time.sleep`` in a
    sync handler, ``await asyncio.sleep`` in an async one."""
    versus: str | None = None
    """A second scenario to compare with (the sync path beside an async one)."""
    delayed: bool = False
    """The consumers reach both emulators through the session's delay proxies, which add
    production's round trips (``--firestore-rtt-ms``, ``--pubsub-rtt-ms``; see
    :mod:`benchmarks.latency`)."""
    stock_acks: bool = False
    """Every ack goes through the stock client's dispatcher, never straight to Pub/Sub
    (:mod:`pubsub_worker._delivery.acks`): for tuning."""
    run_threads: int | None = None
    """``run()``'s ``PUBSUB_WORKER_MAX_MESSAGES`` (its callback threads; as many more
    messages prefetched, the default); None: its default (:data:`_RUN_THREADS`)."""

    def env(self) -> dict[str, str]:
        """What the scenario sets in its consumers' environment."""
        if self.run_threads is None:
            return {}
        return {"PUBSUB_WORKER_MAX_MESSAGES": str(self.run_threads)}

    @property
    def stock(self) -> bool:
        """The stock client, no wrapper: no Firestore."""
        return self.kind in ("stock-ack", "stock-eod")

    def in_flight(self, concurrency: int) -> int:
        """Messages the client lets in at once, per process."""
        if self.subscribe == "default":
            return 1000  # FlowControl().max_messages
        if self.subscribe == "run":  # MAX_MESSAGES, and as many prefetched (the default)
            return 2 * self.threads(concurrency)
        return self.concurrency or concurrency

    def threads(self, concurrency: int) -> int:
        """Callback threads per process."""
        if self.subscribe == "run":
            return self.run_threads or _RUN_THREADS
        if self.subscribe == "default":
            return 10  # the client's default ThreadScheduler
        return self.in_flight(concurrency)


def _pair(
    suffix: str, label: str, *, latency: bool = False, **setup: Any
) -> tuple[Scenario, Scenario]:
    """The stock EOD client and the one-step wrapper, with the same setup."""
    stock = Scenario(
        f"stock-eod-{suffix}",
        "stock-eod",
        f"stock, EOD, {label}",
        baseline=f"stock-eod-{suffix}",
        latency=latency,
        **setup,
    )
    wrapped = Scenario(
        f"wrapped-1-{suffix}",
        "wrapped",
        f"`exactly_once`, 1 step, {label}",
        baseline=stock.name,
        steps=1,
        latency=latency,
        **setup,
    )
    return stock, wrapped


def _default_rtt_batched(suffix: str, what: str, **batching: float) -> Scenario:
    """The client's defaults at production round trips on the batching store, tuned."""
    return Scenario(
        f"wrapped-1-default-rtt-{suffix}",
        "wrapped",
        f"`exactly_once`, 1 step, client defaults, production round trips, BatchWrite, {what}",
        baseline="stock-eod-default-rtt",
        steps=1,
        subscribe="default",
        latency=True,
        delayed=True,
        store="batched",
        batching=batching,
    )


_ALL: tuple[Scenario, ...] = (
    # -- core: 10 in flight (the session's --concurrency), 0/1/3 steps
    Scenario(
        "stock-ack",
        "stock-ack",
        "stock, `message.ack()`, no EOD",
        eod=False,
        latency=True,
    ),
    Scenario(
        "stock-eod",
        "stock-eod",
        "stock, EOD, awaited `ack_with_response()`",
        latency=True,
    ),
    Scenario("wrapped-0", "wrapped", "`exactly_once`, 0 steps", steps=0, latency=True),
    Scenario("wrapped-1", "wrapped", "`exactly_once`, 1 step", steps=1, latency=True),
    Scenario("wrapped-3", "wrapped", "`exactly_once`, 3 steps", steps=3, latency=True),
    # -- the adoption paths, with their own defaults
    *_pair("default", "client defaults (plain `subscribe`)", subscribe="default"),
    Scenario(
        "legacy-default",
        "legacy",
        "`exactly_once(stock EOD callback)`, client defaults: the one added line",
        baseline="stock-eod-default",
        subscribe="default",
    ),
    Scenario(
        "run-1",
        "run",
        "`pubsub_worker.run()` defaults, 1 step",
        steps=1,
        subscribe="run",
    ),
    # -- the wrapper's own cost: the same wrapper on the in-memory store (no Firestore)
    Scenario(
        "wrapped-1-memory",
        "wrapped",
        "`exactly_once`, 1 step, in-memory store (no Firestore)",
        steps=1,
        store="memory",
    ),
    Scenario(
        "wrapped-1-memory-default",
        "wrapped",
        "`exactly_once`, 1 step, in-memory store, client defaults",
        baseline="stock-eod-default",
        steps=1,
        subscribe="default",
        store="memory",
    ),
    # -- flow control: each side's best per process
    *_pair("c30", "30 in flight", concurrency=30),
    *_pair("c100", "100 in flight", concurrency=100),
    # -- async def handlers against the sync path, at the same flow control (100 in flight)
    Scenario(
        "async-1-c100",
        "wrapped",
        "`exactly_once(async def)`, 1 step, 100 in flight",
        baseline="stock-eod-c100",
        steps=1,
        concurrency=100,
        asynchronous=True,
        versus="wrapped-1-c100",
    ),
    Scenario(
        "wrapped-io-c100",
        "wrapped",
        "`exactly_once`, 1 step waiting 20 ms, 100 in flight",
        baseline="stock-eod-c100",
        steps=1,
        concurrency=100,
        step_io_ms=20.0,
    ),
    Scenario(
        "async-io-c100",
        "wrapped",
        "`exactly_once(async def)`, 1 step awaiting 20 ms, 100 in flight",
        baseline="stock-eod-c100",
        steps=1,
        concurrency=100,
        asynchronous=True,
        step_io_ms=20.0,
        versus="wrapped-io-c100",
    ),
    # -- a fleet on one subscription
    *_pair("p2", "2 processes", processes=2),
    *_pair("p4", "4 processes", processes=4),
    *(
        Scenario(
            f"run-p{n}",
            "run",
            f"`pubsub_worker.run()` defaults, 1 step, {n} processes "
            f"(what `pubsub-worker run --processes {n}` starts)",
            baseline=f"stock-eod-p{n}",
            steps=1,
            subscribe="run",
            processes=n,
        )
        for n in (2, 4)
    ),
    # -- payload size
    *_pair("10k", "10 KB payload", payload_bytes=10_000),
    *_pair("1m", "1 MB payload", payload_bytes=1_000_000, backlog_share=0.1),
    # -- production round trips: both emulators behind the delay proxies (not in the default set)
    *_pair("rtt", "10 in flight, production round trips", latency=True, delayed=True),
    *_pair(
        "c100-rtt",
        "100 in flight, production round trips",
        latency=True,
        delayed=True,
        concurrency=100,
    ),
    *_pair(
        "default-rtt",
        "client defaults, production round trips",
        latency=True,
        delayed=True,
        subscribe="default",
    ),
    Scenario(
        "run-1-rtt",
        "run",
        "`pubsub_worker.run()` defaults, 1 step, production round trips",
        baseline="stock-eod-default-rtt",
        steps=1,
        subscribe="run",
        latency=True,
        delayed=True,
    ),
    # -- store variants, for tuning (not in the default set)
    Scenario(
        "wrapped-1-direct",
        "wrapped",
        "`exactly_once`, 1 step, `FirestoreJobStore` (one RPC per write)",
        steps=1,
        store="direct",
    ),
    Scenario(
        "wrapped-1-batched-2",
        "wrapped",
        "`exactly_once`, 1 step, BatchWrite, 2 batches in flight, up to 4 for slow round trips",
        steps=1,
        store="batched",
        batching={"max_in_flight": 2},
    ),
    Scenario(
        "wrapped-1-batched-4",
        "wrapped",
        "`exactly_once`, 1 step, BatchWrite, 4 batches in flight",
        steps=1,
        store="batched",
        batching={"max_in_flight": 4},
    ),
    Scenario(
        "wrapped-1-c100-batched-4",
        "wrapped",
        "`exactly_once`, 1 step, 100 in flight, BatchWrite, 4 batches in flight",
        baseline="stock-eod-c100",
        steps=1,
        concurrency=100,
        store="batched",
        batching={"max_in_flight": 4},
    ),
    *(
        _default_rtt_batched(f"batched-{slots}", f"{slots} batches in flight", max_in_flight=slots)
        for slots in (4, 8)
    ),
    _default_rtt_batched(
        "fixed-2",
        "2 batches in flight, none more for slow round trips",
        max_in_flight=2,
        slow_in_flight=2,
    ),
    _default_rtt_batched(
        "batched-2", "2 batches in flight, up to 4 for slow round trips", max_in_flight=2
    ),
    _default_rtt_batched(
        "slow-2ms", "1 batch in flight, a slow slot after 2 ms", slow_after_s=0.002
    ),
    _default_rtt_batched("no-gather", "no batch held open for other jobs", gather_s=0.0),
    Scenario(
        "run-1-rtt-10",
        "run",
        "`pubsub_worker.run()`, 1 step, production round trips, 10 threads (20 admitted)",
        baseline="stock-eod-default-rtt",
        steps=1,
        subscribe="run",
        latency=True,
        delayed=True,
        run_threads=10,
    ),
    Scenario(
        "run-1-10",
        "run",
        "`pubsub_worker.run()`, 1 step, 10 threads (20 admitted)",
        steps=1,
        subscribe="run",
        run_threads=10,
    ),
    Scenario(
        "wrapped-1-slow-2ms",
        "wrapped",
        "`exactly_once`, 1 step, BatchWrite, 1 batch in flight, a slow slot after 2 ms",
        steps=1,
        store="batched",
        batching={"slow_after_s": 0.002},
    ),
    Scenario(
        "wrapped-1-fixed-2",
        "wrapped",
        "`exactly_once`, 1 step, BatchWrite, 2 batches in flight, none more for slow round trips",
        steps=1,
        store="batched",
        batching={"max_in_flight": 2, "slow_in_flight": 2},
    ),
    Scenario(
        "wrapped-1-batched-linger",
        "wrapped",
        "`exactly_once`, 1 step, BatchWrite, 1 ms linger",
        steps=1,
        store="batched",
        batching={"linger_s": 0.001},
    ),
)

_BATCHED = "batched"
_TUNINGS: tuple[tuple[str, str, dict[str, Any], tuple[str, ...]], ...] = (
    (
        "no-gather",
        "BatchWrite, no batch held open for other jobs",
        {"store": _BATCHED, "batching": {"gather_s": 0.0}},
        ("wrapped-1", "wrapped-1-default", "run-1", "run-1-rtt", "wrapped-1-c100"),
    ),
    (
        "slow-2ms",
        "BatchWrite, a slow slot after 2 ms",
        {"store": _BATCHED, "batching": {"slow_after_s": 0.002}},
        ("run-1-rtt",),
    ),
    (
        "stock-acks",
        "every ack sent by the stock client",
        {"stock_acks": True},
        ("wrapped-1-default", "wrapped-1-memory-default", "run-1", "wrapped-1-c100"),
    ),
)
"""Tuning: these scenarios again, changed so (suffix, what, the fields changed, bases)."""

_ALL += tuple(
    replace(base, name=f"{base.name}-{suffix}", label=f"{base.label}, {what}", **changes)
    for suffix, what, changes, bases in _TUNINGS
    for base in _ALL
    if base.name in bases
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _ALL}

BASELINE = "stock-eod"
"""The reference of the 10-in-flight scenarios and of the CPU comparison."""

GROUPS: dict[str, tuple[str, ...]] = {
    "core": ("stock-ack", "stock-eod", "wrapped-0", "wrapped-1", "wrapped-3"),
    "default": ("stock-eod-default", "wrapped-1-default", "legacy-default", "run-1"),
    "memory": (
        *("stock-eod", "wrapped-1", "wrapped-1-memory"),
        *("stock-eod-default", "wrapped-1-default", "wrapped-1-memory-default"),
    ),
    "flow": (
        *("stock-eod", "wrapped-1", "stock-eod-default", "wrapped-1-default"),
        *("stock-eod-c30", "wrapped-1-c30", "stock-eod-c100", "wrapped-1-c100"),
    ),
    "fleet": (
        *("stock-eod", "wrapped-1", "run-1"),
        *("stock-eod-p2", "wrapped-1-p2", "run-p2", "stock-eod-p4", "wrapped-1-p4", "run-p4"),
    ),
    "async": (
        *("stock-eod-c100", "wrapped-1-c100", "async-1-c100"),
        *("wrapped-io-c100", "async-io-c100"),
    ),
    "payload": ("stock-eod-10k", "wrapped-1-10k", "stock-eod-1m", "wrapped-1-1m"),
    "stores": (
        *("wrapped-1-direct", "wrapped-1-batched-2", "wrapped-1-batched-4"),
        *("wrapped-1-batched-linger", "stock-eod-c100", "wrapped-1-c100-batched-4"),
        "wrapped-1-fixed-2",
    ),
    "latency": (
        *("stock-eod-default-rtt", "wrapped-1-default-rtt", "run-1-rtt"),
        *("stock-eod-rtt", "wrapped-1-rtt", "stock-eod-c100-rtt", "wrapped-1-c100-rtt"),
    ),
}
"""Families of scenarios, usable in ``--scenarios`` in place of names."""

DEFAULT_SCENARIOS = ("core", "default", "memory", "flow", "async", "fleet", "payload")
"""What ``python -m benchmarks.run`` runs without ``--scenarios``."""


def expand(names: Sequence[str]) -> tuple[str, ...]:
    """Scenario names from names and group names, baselines and comparisons added, in a
    stable order.

    Raises :class:`KeyError` naming the first unknown entry.
    """
    chosen: list[str] = []
    for name in names:
        members = GROUPS.get(name, (name,))
        for member in members:
            if member not in SCENARIOS:
                raise KeyError(member)
            chosen.append(member)
    with_baselines: list[str] = []
    while chosen:
        name = chosen.pop()
        if name in with_baselines:
            continue
        with_baselines.append(name)
        scenario = SCENARIOS[name]
        chosen.extend(n for n in (scenario.baseline, scenario.versus) if n is not None)
    if BASELINE not in with_baselines:
        with_baselines.insert(0, BASELINE)
    order = list(SCENARIOS)
    return tuple(sorted(with_baselines, key=order.index))
