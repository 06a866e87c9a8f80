"""How steady the machine's cores are: a fixed chunk of Python, timed on each core at once.

``python -m benchmarks.speed --seconds 30`` times the same pure-Python chunk
every 25 ms on every core at once and prints each core's per-second medians.
On a shared host a virtual core's speed is not constant: on the benchmark's
machine, idle, the chunk took about 0.37 ms in some spells and 0.57-0.60 ms
in others, spells of seconds, each core on its own. The benchmark's figures
move with them (``docs/benchmarks-history.md``, "How far one run's ratios can be
trusted"): run this before a session to see what the host is doing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["INTERVAL_S", "chunk_ms", "main", "spells"]

INTERVAL_S = 0.025
"""A chunk every this often (a chunk is well under 1 ms: a few percent of the core)."""
_LOOPS = 5000


def _work() -> int:
    table: dict[int, int] = {}
    for i in range(_LOOPS):
        key = i % 97
        table[key] = table.get(key, 0) + i
    return len(table)


def chunk_ms() -> float:
    """The thread's CPU time of one chunk, in ms."""
    started = time.thread_time()
    _work()
    return (time.thread_time() - started) * 1000


def spells(seconds: float) -> list[float]:
    """Per-second medians of the chunk, here, for ``seconds``."""
    medians: list[float] = []
    chunks: list[float] = []
    _work()  # warm
    second = time.monotonic() + 1
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        chunks.append(chunk_ms())
        time.sleep(INTERVAL_S)
        if time.monotonic() >= second:
            medians.append(statistics.median(chunks))
            chunks, second = [], second + 1
    return medians


def _on_core(seconds: float, core: int) -> list[float]:
    """:func:`spells` in a child process pinned to ``core``."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed", "--seconds", str(seconds), "--on", str(core)],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    return [float(x) for x in out.stdout.split()]


def main(argv: Sequence[str] | None = None) -> int:
    """Time the chunk on every core at once, per second: how much and how often speed moves."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed",
        description="Time a fixed chunk of Python on every core at once, per second.",
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--on", type=int, help=argparse.SUPPRESS)  # the child's core
    args = parser.parse_args(argv)
    if args.on is not None:
        os.sched_setaffinity(0, {args.on})
        print(" ".join(f"{m:.3f}" for m in spells(args.seconds)))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    print(
        f"a chunk of Python timed every {INTERVAL_S * 1000:.0f} ms on each of cores "
        f"{', '.join(map(str, cores))} at once, for {args.seconds:g} s; per-second medians, ms"
    )
    results: dict[int, list[float]] = {}

    def measure(core: int) -> None:
        results[core] = _on_core(args.seconds, core)

    threads = [threading.Thread(target=measure, args=(core,)) for core in cores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for core in cores:
        medians = results.get(core) or []
        if not medians:
            print(f"core {core}: no figure")
            continue
        low, high = min(medians), max(medians)
        print(
            f"core {core}: {low:.2f}-{high:.2f} ms ({high / low:.2f}x); "
            + " ".join(f"{m:.2f}" for m in medians)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
