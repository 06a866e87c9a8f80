"""A consumer's CPU by thread role: where the CPU a message costs is spent.

:func:`thread_cpu_s` reads the CPU time of every live thread of this process
from ``/proc/self/task`` (each thread's ``schedstat``: Linux; elsewhere it
returns nothing) and adds it up by :data:`ROLES`, named from the thread's
Python name (or, for threads that Python did not start, such as gRPC's
C-core threads, the kernel's name).
Threads that ended before the reading are one more role, ``ended``: the
process's CPU less that of its live threads. The consumer reports a reading
at every mark (:mod:`benchmarks.consumer`); a phase's share of each role is
the difference between two readings.

:func:`thread_switches` counts, by the same roles, the times each thread
was switched out (``voluntary_ctxt_switches``: it blocked, on a lock, a
queue, an RPC or the GIL; ``nonvoluntary_ctxt_switches``: preempted). Each
is a wake-up to come, and a hand-off between threads costs one or two: per
message, the count shows the hand-offs a design makes.
"""

from __future__ import annotations

import os
import re
import resource
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["ROLES", "role", "thread_cpu_s", "thread_switches"]

ROLES: dict[str, str] = {
    "callbacks": "callback threads: the callback, the wrapper's work on it, "
    "and the writes each sends itself",
    "completer": "the completer: conclusions handed off by `run()`",
    "writers": "batch writers: `BatchWrite` RPCs sent off the callback threads",
    "pubsub": "the Pub/Sub client's own threads: dispatcher (acks, modacks), leaser, "
    "heartbeater, stream",
    "grpc": "gRPC's C-core threads (event engine, timers)",
    "other": "every other live thread: the harness, the library's lease keeper",
    "ended": "threads that ended during the phase (idle pool threads, flushers)",
}
"""Role -> what it holds, in the order the report shows them."""

_SUFFIX = re.compile(r"[-_ ]?\d+$")
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("pubsub-worker-complete", "completer"),
    ("pubsub-worker-batch-writer", "writers"),
    ("pubsub-worker-", "other"),
    ("pubsub-worker", "callbacks"),  # run()'s pool: pubsub-worker_0, pubsub-worker_1 ...
    ("ThreadPoolExecutor-ThreadScheduler", "callbacks"),  # the stock client's scheduler
    ("bench-", "other"),
    ("bench", "callbacks"),  # the benchmark's fixed pools: bench_0 ...
    ("Thread-CallbackRequestDispatcher", "pubsub"),
    ("Thread-LeaseMaintainer", "pubsub"),
    ("Thread-Heartbeater", "pubsub"),
    ("Thread-ConsumeBidirectionalStream", "pubsub"),
    ("event_engine", "grpc"),
    ("grpc", "grpc"),
)


def role(name: str) -> str:
    """The role of a thread called ``name`` (its Python name, else the kernel's).

    A pool's number is not part of it: ``bench_7`` is a ``bench`` thread.
    """
    stem = _SUFFIX.sub("", name) or name
    for prefix, found in _PREFIXES:
        if stem.startswith(prefix):
            return found
    return "other"


def _by_role(read: Callable[[Path], tuple[float, str] | None]) -> dict[str, float]:
    """``read(task)`` (a figure and the kernel's name of the thread) summed by role over
    this process's live threads; {} off Linux. A thread ``read`` finds gone is skipped."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    summed = dict.fromkeys(ROLES, 0.0)
    for tid in os.listdir(tasks):
        found = read(tasks / tid)
        if found is not None:
            value, kernel_name = found
            summed[role(names.get(int(tid), kernel_name))] += value
    return summed


def _on_cpu_s(task: Path) -> tuple[float, str] | None:
    try:
        # The thread's time on a CPU, in ns: exact, where stat's user and system
        # times are whole clock ticks (10 ms), too coarse for a phase's share.
        on_cpu_ns = int((task / "schedstat").read_text().split()[0])
        return on_cpu_ns / 1e9, (task / "comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None  # ended while read, or no scheduler statistics


def _switched(task: Path) -> tuple[float, str] | None:
    try:
        status = (task / "status").read_text()
    except OSError:
        return None  # ended while read
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        count = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
    except (KeyError, ValueError):
        return None
    return float(count), fields.get("Name", "").strip()


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by role; {} off Linux."""
    spent = _by_role(_on_cpu_s)
    if spent:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        spent["ended"] = max(usage.ru_utime + usage.ru_stime - sum(spent.values()), 0.0)
    return spent


def thread_switches() -> dict[str, int]:
    """Context switches so far of this process's threads, by role; {} off Linux.

    ``ended`` is the process's count (``getrusage``, every thread it ever
    had) less that of its live threads.
    """
    switches = {name: int(count) for name, count in _by_role(_switched).items()}
    if switches:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        switches["ended"] = max(usage.ru_nvcsw + usage.ru_nivcsw - sum(switches.values()), 0)
    return switches
