"""Which cores the consumer runs on: its own, apart from the emulators and the harness.

In production Pub/Sub and Firestore are services on other machines: the
consumer's cores and caches are its own. Here both emulators (Java, busy
with every write) share the machine with it, and on a shared core they evict
the consumer's caches between one message's steps: Python run cold costs
several times what it costs warm (``python -m benchmarks.inprocess --evict
64``: the wrapper's own path 0.22 ms per message warm, 0.88 with the caches
emptied before each message), and the more Python a message runs the more
it pays, so a shared core charges the wrapper for the emulators' work.

The **split** layout (the default, on a machine of two or more cores) gives
the consumer of a one-process scenario the last core this process may use,
and moves the emulators' threads and this harness's (the publisher, the
delay proxies) to the others; a scenario of several consumer processes runs
on every core, as before, its point being what a machine of processes does.
The stock client and the wrapper get the same layout in the same run.
**shared** leaves every process on every core. The report names the layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV", "Layout", "pin_self_from_env", "pin_tree"]

ENV = "BENCH_CONSUMER_CPUS"
"""The consumer's cores, comma-separated, set by the harness; unset: every core."""


@dataclass(frozen=True)
class Layout:
    """The cores of a one-process scenario's consumer, and everyone else's."""

    consumer: frozenset[int]
    rest: frozenset[int]

    @classmethod
    def split(cls, cpus: Iterable[int]) -> Layout | None:
        """The last of ``cpus`` for the consumer, the others for the rest; None under two."""
        ordered = sorted(set(cpus))
        if len(ordered) < 2:
            return None
        return cls(consumer=frozenset(ordered[-1:]), rest=frozenset(ordered[:-1]))

    @property
    def every(self) -> frozenset[int]:
        return self.consumer | self.rest

    def describe(self) -> str:
        """One line for the report."""
        return (
            f"the consumer of a one-process scenario on core {_cores(self.consumer)}, the "
            f"emulators and the harness on core {_cores(self.rest)}; several consumer "
            "processes share every core"
        )

    def kept_by(self, consumer_cpus: Iterable[Iterable[int] | None]) -> bool:
        """Whether every consumer of a one-process run reported the consumer's cores."""
        return all(set(cpus or ()) == self.consumer for cpus in consumer_cpus)

    def consumer_env(self) -> Mapping[str, str]:
        """The consumer process's variable that pins it (:func:`pin_self_from_env`)."""
        return {ENV: ",".join(str(cpu) for cpu in sorted(self.consumer))}


def _cores(cpus: frozenset[int]) -> str:
    return ", ".join(str(cpu) for cpu in sorted(cpus))


def pin_tree(pid: int, cpus: frozenset[int]) -> int:
    """Move every thread of ``pid`` and of its descendants to ``cpus``; threads moved.

    A thread gone meanwhile is skipped; threads started later inherit their
    creator's cores. Linux only (``/proc``); elsewhere nothing moves.
    """
    moved = 0
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue  # ended while moved
        moved += 1
    return moved


def _threads(pid: int) -> Iterator[int]:
    """The threads of ``pid`` and of its descendants (``/proc/<pid>/task/<tid>/children``)."""
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            tids = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue  # ended
        for tid in tids:
            yield int(tid)
            try:
                children = Path(f"/proc/{current}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            pending.extend(int(child) for child in children)


def pin_self_from_env(environ: Mapping[str, str] = os.environ) -> frozenset[int] | None:
    """In a consumer: move this process's threads to the cores :data:`ENV` names.

    Called first thing, before the clients start their threads. The cores
    may lie outside the ones this process inherited (the harness's, moved
    off them). Returns the cores, or None when the variable is unset or names
    no core the machine lets this process have (then nothing moves; the
    consumer reports the cores it ran on, so the report shows it).
    """
    wanted = environ.get(ENV, "").strip()
    if not wanted:
        return None
    cpus = frozenset(int(cpu) for cpu in wanted.split(","))
    try:
        os.sched_setaffinity(0, cpus)  # refused (EINVAL) when none of them may be had
    except OSError:
        return None
    pin_tree(os.getpid(), cpus)  # the threads already started
    return cpus
