"""A benchmark session's split layout, on the emulators: the consumer on a core of its own.

No figure is judged: what is asserted is where each process ran, and that the
emulators and the harness got every core back at the end.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.run import parse_args, session_report
from emulator import Emulators

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the split needs two cores"),
]

TINY = (
    *("--messages", "12", "--paced", "0", "--lone", "0", "--warmup", "0", "--repeats", "1"),
    *("--settle", "0", "--profiles", "-", "--markdown", "-", "--json", "-", "--plot", "-"),
)


def _threads_cores(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


def test_a_one_process_consumer_runs_alone_on_the_last_core(emulators: Emulators) -> None:
    every = frozenset(os.sched_getaffinity(0))
    options = parse_args(["--scenarios", "stock-eod,wrapped-1-p2", *TINY])
    report = session_report(options, emulators)
    by_name = {run["scenario"]: run for run in report["runs"]}
    assert by_name["stock-eod"]["consumer_cpus"] == [[max(every)]]
    assert f"core {max(every)}" in report["cores"]
    # two processes: every core, theirs and the emulators'
    assert by_name["wrapped-1-p2"]["consumer_cpus"] == [sorted(every)] * 2
    # given back: this process and the emulators on every core again
    assert _threads_cores(os.getpid()) == {every}
    for pid in emulators.pids.values():
        assert _threads_cores(pid) == {every}


def test_shared_leaves_every_process_on_every_core(emulators: Emulators) -> None:
    every = sorted(os.sched_getaffinity(0))
    options = parse_args(["--scenarios", "stock-eod", "--cores", "shared", *TINY])
    report = session_report(options, emulators)
    assert [run["consumer_cpus"] for run in report["runs"]] == [[every]]
    assert report["cores"] == "every process on every core"
