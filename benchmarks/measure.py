"""The figures of one phase, from the consumers' records and marks (see :mod:`benchmarks.fleet`),
and the comparison of two scenarios' runs within each repeat."""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from benchmarks.machine import CpuMark, cpu_between

__all__ = [
    "Member",
    "cpu_shares",
    "paired",
    "percentiles",
    "phase_stats",
    "rpc_delta",
    "thread_delta",
]


class Member(Protocol):
    """A consumer process as the figures see it: its place and the marks it sent."""

    index: int
    marks: dict[str, dict[str, Any]]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, p50, p90, p99 and max of ``values`` (all None for none)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "mean": statistics.fmean(ordered),
        "p50": pick(0.50),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": ordered[-1],
    }


def paired(
    runs: Sequence[dict[str, Any]],
    name: str,
    other: str,
    get: Callable[[dict[str, Any]], float],
    combine: Callable[[float, float], float] = operator.truediv,
) -> list[float]:
    """``combine(get(name), get(other))`` within each repeat where both runs are good.

    The ratio by default; ``operator.sub`` for a difference. A run lacking
    the figure (or a zero to divide by) is left out.
    """
    by_repeat = {r["repeat"]: r for r in runs if r["scenario"] == other and r["ok"]}
    out = []
    for run in runs:
        if run["scenario"] != name or not run["ok"] or run["repeat"] not in by_repeat:
            continue
        try:
            out.append(combine(get(run), get(by_repeat[run["repeat"]])))
        except (KeyError, TypeError, ZeroDivisionError):
            continue
    return out


def rpc_delta(
    members: Sequence[Member], first: str, last: str, kind: str
) -> dict[str, dict[str, int]]:
    """RPC calls and items of ``kind`` (pubsub or firestore) between two marks, fleet-wide."""
    out: dict[str, dict[str, int]] = {
        what: {} for what in ("calls", "items", "reads", "deletes", "micros")
    }
    for member in members:
        before, after = member.marks[first][kind], member.marks[last][kind]
        for what, moved_by in out.items():
            for method, value in after.get(what, {}).items():
                moved = value - before.get(what, {}).get(method, 0)
                if moved:
                    moved_by[method] = moved_by.get(method, 0) + moved
    return out


def phase_stats(
    records: Sequence[Sequence[Any]],
    members: Sequence[Member],
    first: str,
    last: str,
    slots: int,
) -> dict[str, Any]:
    """Throughput, times and RPCs of one phase.

    ``records`` are the phase's finished messages (``[id, start, end, done,
    publish_wall, done_wall, process]``, see :mod:`benchmarks.consumer`);
    ``first`` and ``last`` name the marks around the phase; ``slots`` is the
    callback threads of the whole fleet.
    """
    count = max(len(records), 1)
    begin = min(r[1] for r in records)
    end = max(r[3] for r in records)
    elapsed = max(end - begin, 1e-9)
    firestore = rpc_delta(members, first, last, "firestore")
    pubsub = rpc_delta(members, first, last, "pubsub")
    return {
        "messages": len(records),
        "elapsed_s": elapsed,
        "msgs_per_s": len(records) / elapsed,
        "callback_ms": percentiles([(r[2] - r[1]) * 1000 for r in records]),
        "slot_ms": percentiles([(r[3] - r[1]) * 1000 for r in records]),
        "latency_ms": percentiles([(r[5] - r[4]) * 1000 for r in records if r[4]]),
        # Publish to the callback's start: the part of the latency before any callback ran.
        "reach_ms": percentiles([(r[5] - (r[3] - r[1]) - r[4]) * 1000 for r in records if r[4]]),
        # The callback's return to the ack's answer: the ack's own wait (0 where it waits inside).
        "after_ms": percentiles([(r[3] - r[2]) * 1000 for r in records]),
        # Share of the callback threads busy in a callback: below 1, messages came too slowly.
        "occupancy": sum(r[2] - r[1] for r in records) / (elapsed * slots),
        "firestore": firestore,
        "pubsub": pubsub,
        "firestore_rpcs_per_msg": sum(firestore["calls"].values()) / count,
        "firestore_writes_per_msg": sum(firestore["items"].values()) / count,
        # What Firestore bills per message (one job each): writes (deletes apart), reads, deletes.
        "billed_writes_per_msg": (
            sum(n for m, n in firestore["items"].items() if m in ("Commit", "BatchWrite"))
            - sum(firestore["deletes"].values())
        )
        / count,
        "billed_reads_per_msg": sum(firestore["reads"].values()) / count,
        "billed_deletes_per_msg": sum(firestore["deletes"].values()) / count,
        # The time callers waited for Firestore's answers, per message (lone: the round trips).
        "firestore_rpc_ms_per_msg": sum(firestore["micros"].values()) / 1000 / count,
        "pubsub_rpcs_per_msg": sum(pubsub["calls"].values()) / count,
        "consumer_cpu_s": [m.marks[last]["cpu_s"] - m.marks[first]["cpu_s"] for m in members],
        "consumer_cpu_by_thread_s": thread_delta(members, first, last),
        "consumer_switches_by_thread": thread_delta(members, first, last, "switches"),
        "leased_peak": [m.marks[last]["leased_peak"] for m in members],
        "per_process_msgs": [sum(1 for r in records if r[6] == m.index) for m in members],
    }


def thread_delta(
    members: Sequence[Member], first: str, last: str, reading: str = "threads"
) -> dict[str, float]:
    """A reading of the consumers' threads between two marks, by role (all processes).

    ``threads``: CPU seconds; ``switches``: context switches.
    """
    spent: dict[str, float] = {}
    for member in members:
        before = member.marks[first].get(reading, {})
        for role, seconds in member.marks[last].get(reading, {}).items():
            spent[role] = spent.get(role, 0.0) + seconds - before.get(role, 0.0)
    return spent


def cpu_shares(before: CpuMark, after: CpuMark, members: Sequence[Member]) -> dict[str, Any]:
    """Emulators' and the machine's CPU over the backlog phase; the rest as "others".

    "Others" is what work outside the benchmark took meanwhile, in cores:
    the machine's busy time less the consumers' (their own account), the
    emulators' and the orchestrator's; "stolen" the part of it the hypervisor
    gave to other machines on the host.
    """
    spent = cpu_between(before, after)
    consumers = sum(m.marks["backlog"]["cpu_s"] - m.marks["start"]["cpu_s"] for m in members)
    ours = (
        consumers
        + spent.get("firestore_emulator_s", 0.0)
        + spent.get("pubsub_emulator_s", 0.0)
        + spent["orchestrator_s"]
    )
    wall = max(spent["wall_s"], 1e-9)
    spent["other_load_cores"] = max(spent["machine_busy_s"] - ours, 0.0) / wall
    spent["stolen_cores"] = spent["stolen_s"] / wall
    return spent
