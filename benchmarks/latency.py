"""Production round trips: both emulators behind loopback delay proxies (the ``latency`` group).

On loopback a Firestore commit and a Pub/Sub ack are answered in about a
millisecond; in production each is a round trip to a service over the
network. Then the question changes: how many messages in flight does the
wrapper need to keep up with the stock client, and what latency does it add.
The ``delayed`` scenarios (:mod:`benchmarks.scenarios`, group ``latency``)
answer it: their consumer processes, the stock client's and the wrapper's
alike, reach each emulator only through a :class:`emulator.TcpProxy` that
adds a fixed round trip (:meth:`emulator.TcpProxy.delay`): ``--firestore-rtt-ms``
(default :data:`FIRESTORE_RTT_MS`) to every Firestore call and
``--pubsub-rtt-ms`` (:data:`PUBSUB_RTT_MS`) to every Pub/Sub one. The
orchestrator publishes, creates the subscriptions and empties Firestore
directly: none of that is measured.

One round trip: the proxy holds every chunk it forwards for half the round
trip in each direction, in order. A unary call (``Commit``, ``BatchWrite``,
``Acknowledge``, ``ModifyAckDeadline``) pays one round trip: its request half,
its answer half. On the streaming pull a message reaches the client half a
round trip after the server sent it. With exactly-once delivery the stock
client sends a receipt ``ModifyAckDeadline`` for each pull response and waits
for its answer (one round trip) before its callbacks see the messages; the
ack is one more. So from the server's send to the ack's answer a message
costs at least 2.5 Pub/Sub round trips whoever consumes it, and a one-step
job in the wrapper two Firestore round trips more (the claim, and the
completion with the step's record).

Added latency: from the emulator's publish time to the ack's answer in the
consumer, the paced phase's p50 (and p99) of a wrapped scenario less the
stock client's with the same setup, in the same repeat; the median over
repeats. Both are measured the same way, so the difference is what the
wrapper adds.
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from benchmarks.measure import paired
from benchmarks.scenarios import SCENARIOS
from benchmarks.targets import Target, ratio_target

if TYPE_CHECKING:
    from emulator import Emulators

__all__ = [
    "FIRESTORE_RTT_MS",
    "PUBSUB_RTT_MS",
    "STOCK_DEFAULTS",
    "DelayProxies",
    "added_ms",
    "bound",
    "latency_section",
    "latency_targets",
]

FIRESTORE_RTT_MS = 10.0
"""Added to every Firestore round trip by default: a stand-in, no in-region figure is published."""
PUBSUB_RTT_MS = 20.0
"""Added to every Pub/Sub round trip by default: a stand-in, no in-region figure is published."""
PAGE = "benchmarks.md"
"""The page (beside the report's) that explains the group: its report may be a file of its own."""
STOCK_DEFAULTS = "stock-eod-default-rtt"
"""The stock client at its defaults through the proxies: every delayed scenario's yardstick."""


class DelayProxies:
    """A delay proxy in front of each emulator, for the consumers of the delayed scenarios.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, emulators: Emulators, *, firestore_rtt_ms: float, pubsub_rtt_ms: float):
        from emulator import TcpProxy  # noqa: PLC0415 - the report reads this module too

        if emulators.firestore_host is None or emulators.pubsub_host is None:
            raise ValueError("the delayed scenarios need both emulators")
        self.firestore_rtt_ms = firestore_rtt_ms
        self.pubsub_rtt_ms = pubsub_rtt_ms
        self.firestore = TcpProxy(emulators.firestore_host)
        try:
            self.pubsub = TcpProxy(emulators.pubsub_host)
        except BaseException:
            self.firestore.close()
            raise
        try:
            self.firestore.delay(firestore_rtt_ms / 1000)
            self.pubsub.delay(pubsub_rtt_ms / 1000)
        except BaseException:
            self.close()
            raise

    def env(self) -> dict[str, str]:
        """The consumers' emulator variables: the proxies instead of the emulators."""
        return {
            "FIRESTORE_EMULATOR_HOST": self.firestore.address,
            "PUBSUB_EMULATOR_HOST": self.pubsub.address,
        }

    def close(self) -> None:
        """Stop both proxies (their connections are reset). Idempotent."""
        self.firestore.close()
        self.pubsub.close()

    def __enter__(self) -> DelayProxies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _paced(quantile: str) -> Callable[[dict[str, Any]], float]:
    """A run's paced-phase latency at ``quantile``, ms."""
    return lambda run: float(run["phases"]["paced"]["latency_ms"][quantile])


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def added_ms(report: dict[str, Any], name: str, quantile: str = "p50") -> float | None:
    """What ``name`` adds to the stock client's latency with the same setup, ms.

    The paced phase's ``quantile`` (``p50``, ``p99``) less its baseline's, within each
    repeat, median over repeats; None without both.
    """
    base = SCENARIOS[name].baseline
    return _median(paired(report["runs"], name, base, _paced(quantile), operator.sub))


def _vs_stock_defaults(report: dict[str, Any], name: str) -> float | None:
    """Throughput of ``name`` over the stock client's at its defaults, within each repeat."""
    return _median(
        paired(report["runs"], name, STOCK_DEFAULTS, lambda r: r["phases"]["backlog"]["msgs_per_s"])
    )


def bound(report: dict[str, Any], name: str) -> str | None:
    """What bounds ``name``'s throughput: its callback threads', its slots' and the machine's
    time per message.

    ``run()``'s callback threads are not timed (its hooks time a message from
    receipt to its ack's send, the completer's part included), so its line
    has no thread bound.
    """
    row = report["summary"].get(name)
    if not row or not row["callback_mean_ms"] or not row["slot_mean_ms"]:
        return None
    threads, limit = row["threads"], row["in_flight_limit"]
    callback, slot = row["callback_mean_ms"], row["slot_mean_ms"]
    parts = [f"`{name}`: "]
    if SCENARIOS[name].kind != "run":
        parts.append(
            f"{threads} callback threads, each busy {callback:.1f} ms per message: at most "
            f"{threads * 1000 / callback:,.0f} msg/s; "
        )
    parts.append(
        f"{limit} flow-control slots, each held {slot:.1f} ms from receipt to the ack's answer: "
        f"at most {limit * 1000 / slot:,.0f}"
    )
    machine = _machine_bound(report, row)
    if machine:
        parts.append(f"; {machine}")
    parts.append(f"; measured {row['msgs_per_s']['median'] or 0:,.0f}")
    return "".join(parts)


def _machine_bound(report: dict[str, Any], row: dict[str, Any]) -> str | None:
    """The machine's cores over the CPU a message costs the consumer and both emulators.

    On one machine the emulators' CPU is the consumer's competitor (in
    production Firestore runs elsewhere): when it is near the cores left by
    other work, the machine, not the library's waits, bounds the throughput.
    """
    cpus = report.get("machine", {}).get("cpus")
    cpu = row.get("cpu_ms_per_msg") or {}
    consumer, firestore, pubsub = (
        cpu.get("consumer"),
        cpu.get("firestore_emulator"),
        cpu.get("pubsub_emulator"),
    )
    others, busy = row.get("other_load_cores"), row.get("machine_busy")
    if consumer is None or firestore is None or pubsub is None:
        return None
    if not cpus or others is None or busy is None:
        return None
    total = float(consumer) + float(firestore) + float(pubsub)
    left = max(cpus - others, 0.0)
    return (
        f"the machine: {total:.1f} ms of CPU per message in the consumer and both emulators "
        f"({consumer:.1f} + {firestore:.1f} + {pubsub:.1f}), {left:.2f} of its {cpus} cores "
        f"left by other work: at most {left * 1000 / total:,.0f} ({busy * 100:.0f}% busy)"
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _row(report: dict[str, Any], name: str) -> str:
    row = report["summary"][name]
    stock = SCENARIOS[name].stock
    ratio = row["ratio_vs_baseline"]["median"]
    versus = _vs_stock_defaults(report, name)
    added = (
        "-" if stock else f"{_ms(added_ms(report, name))} / {_ms(added_ms(report, name, 'p99'))}"
    )
    held = f"{_count(row['leased_peak'])} ({row['in_flight_limit']}) / {row['threads']}"
    return (
        f"| {report['scenarios'][name]} | {held} | {_count(row['msgs_per_s']['median'])} "
        f"| {'100%' if stock or ratio is None else f'{ratio * 100:.0f}%'} "
        f"| {'n/a' if versus is None else f'{versus * 100:.0f}%'} "
        f"| {_ms(row['latency_p50_ms'])} / {_ms(row['latency_p99_ms'])} | {added} "
        f"| {_ms(row['lone_slot_ms'])} |"
    )


def latency_section(report: dict[str, Any]) -> list[str]:
    """The report's section on the delayed scenarios (none when none ran)."""
    names = [n for n in report["summary"] if n in SCENARIOS and SCENARIOS[n].delayed]
    if not names:
        return []
    options = report["options"]
    firestore = options.get("firestore_rtt_ms", FIRESTORE_RTT_MS)
    pubsub = options.get("pubsub_rtt_ms", PUBSUB_RTT_MS)
    return [
        "",
        "### Production round trips",
        "",
        f"The consumers, stock and wrapped, reach both emulators through loopback delay proxies "
        f"adding {firestore:g} ms to every Firestore round trip and {pubsub:g} ms to every "
        f"Pub/Sub one ([how, and why these figures]({PAGE}#why-latency)). msg/s: the "
        f"backlog phase; latency: the paced phase ({options['paced']} messages at "
        f"{options['rate']:g}/s), "
        "publish time to the ack's answer; added: less the stock client's with the same setup, "
        "in the same repeat; lone: a lone message's callback start to the ack's answer. "
        "Medians over repeats.",
        "",
        "| scenario | in flight (limit) / threads | msg/s | vs stock, same setup "
        "| vs stock at its defaults | p50 / p99 ms | added p50 / p99 ms | lone: to ack ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(_row(report, name) for name in names),
    ]


def _rpc_ms(row: dict[str, Any]) -> float | None:
    """A lone message's Firestore RPC, from the call to its answer, ms: the round trip as paid,
    the proxy's delay, the emulator's work and the client's included."""
    rpcs, waited = row["lone_firestore_rpcs_per_msg"], row["lone_rpc_ms"]
    return waited / rpcs if rpcs and waited is not None else None


def _lone_split(summary: dict[str, Any], name: str) -> str:
    """Where a lone message's time goes in ``name``, against the stock client's."""
    row, base = summary[name], summary.get(summary[name]["baseline"])
    if not base or row["lone_slot_ms"] is None or base["lone_slot_ms"] is None:
        return "(no lone phase in this session)"
    return (
        f"lone `{name}`: {row['lone_slot_ms']:.1f} ms from its callback's start to the ack's "
        f"answer, of which {row['lone_rpc_ms'] or 0:.1f} waiting for Firestore's answers, "
        f"against {base['lone_slot_ms']:.1f} for the stock client"
    )


def _added_target(report: dict[str, Any], at: str, firestore_rtt_ms: float) -> Target:
    """Added p50 against two Firestore round trips as the client pays them, plus 2 ms.

    A round trip as paid is a lone message's Firestore RPC from the call to its
    answer: the proxy's delay, the emulator's own work and the client's. Without
    a lone phase, the proxy's delay alone stands in (a stricter limit).
    """
    target: Target = {
        "target": f"{at}: latency added, publish to the ack's answer, p50 <= two Firestore "
        "round trips as paid (a lone message's RPC, call to answer) + 2 ms, at the client's "
        "defaults and at `run()`'s",
        "measured": "n/a",
        "met": None,
        "why": "latency",
        "page": PAGE,
    }
    added = []
    for name in ("wrapped-1-default-rtt", "run-1-rtt"):
        if name not in report["summary"] or (p50 := added_ms(report, name)) is None:
            continue
        rpc = _rpc_ms(report["summary"][name])
        limit = 2 * (rpc if rpc is not None else firestore_rtt_ms) + 2
        added.append((name, p50, added_ms(report, name, "p99"), rpc, limit))
    if added:
        target["measured"] = "; ".join(
            f"`{name}` {p50:.1f} ms (p99 {_ms(p99)}; a Firestore RPC answered in "
            f"{_ms(rpc)} ms: limit {limit:.1f})"
            for name, p50, p99, rpc, limit in added
        )
        target["met"] = all(p50 <= limit for _, p50, _, _, limit in added)
        worst = max(added, key=lambda found: found[1] - found[4])[0]
        target["stands"] = _lone_split(report["summary"], worst)
    return target


def latency_targets(report: dict[str, Any]) -> list[Target]:
    """At production round trips: the defaults' throughput against the stock client's at its
    defaults, and the latency the wrapper adds; what stands in the way of each filled in."""
    summary, options = report["summary"], report["options"]
    firestore = options.get("firestore_rtt_ms", FIRESTORE_RTT_MS)
    at = (
        f"At production round trips ({firestore:g} ms per Firestore, "
        f"{options.get('pubsub_rtt_ms', PUBSUB_RTT_MS):g} ms per Pub/Sub round trip)"
    )
    targets = [
        ratio_target(
            summary,
            "wrapped-1-default-rtt",
            0.9,
            f"{at}: one step, the client's defaults: >= 90% of the stock client at its defaults",
            "latency",
        ),
        ratio_target(
            summary,
            "run-1-rtt",
            0.9,
            f"{at}: one step, `pubsub_worker.run()` at its defaults: >= 90% of the stock client "
            "at its defaults",
            "latency",
        ),
    ]
    for target in targets:
        target["page"] = PAGE
        if target["met"] is False:
            target["stands"] = bound(report, target["scenario"]) or "(no figures)"
    return [*targets, _added_target(report, at, firestore)]
