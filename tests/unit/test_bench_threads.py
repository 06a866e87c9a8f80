"""The benchmark's CPU by thread role: names -> roles, /proc readings, phase deltas, the table."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.measure import thread_delta
from benchmarks.report import _switch_table, _thread_table
from benchmarks.threads import ROLES, role, thread_cpu_s, thread_switches


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ThreadPoolExecutor-ThreadScheduler_3", "callbacks"),  # the stock client's scheduler
        ("pubsub-worker_2", "callbacks"),  # run()'s pool
        ("bench_7", "callbacks"),
        ("pubsub-worker-complete_0", "completer"),
        ("pubsub-worker-batch-writer-12", "writers"),
        ("pubsub-worker-lease-keeper", "other"),
        ("Thread-CallbackRequestDispatcher", "pubsub"),
        ("Thread-LeaseMaintainer", "pubsub"),
        ("event_engine", "grpc"),
        ("bench-flush", "other"),
        ("MainThread", "other"),
        ("Thread-3 (_run)", "other"),
    ],
)
def test_a_thread_is_counted_under_its_role(name: str, expected: str) -> None:
    assert role(name) == expected


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_busy_thread_shows_under_its_role_and_under_ended_once_gone() -> None:
    before = thread_cpu_s()
    assert set(before) == set(ROLES)
    burnt, release = threading.Event(), threading.Event()

    def work() -> None:
        _burn(0.3)
        burnt.set()
        release.wait(10)

    thread = threading.Thread(target=work, name="pubsub-worker-batch-writer-99")
    thread.start()
    assert burnt.wait(10)
    alive = thread_cpu_s()
    release.set()
    thread.join()
    task = Path(f"/proc/self/task/{thread.native_id}")
    deadline = time.monotonic() + 10
    while task.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # join() returns before the kernel has reaped the thread
    gone = thread_cpu_s()
    assert alive["writers"] - before["writers"] >= 0.25
    assert gone["writers"] < alive["writers"] - 0.2  # the thread left the live ones...
    assert gone["ended"] - before["ended"] >= 0.25  # ...and its CPU stays in the process's


def test_a_phase_takes_each_roles_difference_summed_over_processes() -> None:
    members: list[Any] = [
        SimpleNamespace(
            index=0,
            marks={
                "start": {"threads": {"callbacks": 1.0}},
                "backlog": {"threads": {"callbacks": 3.5, "grpc": 0.5}},
            },
        ),
        SimpleNamespace(
            index=1,
            marks={
                "start": {"threads": {"callbacks": 2.0}},
                "backlog": {"threads": {"callbacks": 2.5}},
            },
        ),
        SimpleNamespace(index=2, marks={"start": {}, "backlog": {}}),  # no reading: nothing
    ]
    assert thread_delta(members, "start", "backlog") == {"callbacks": 3.0, "grpc": 0.5}


def test_the_report_shows_a_row_per_scenario_with_readings() -> None:
    report = {
        "scenarios": {"a": "scenario a", "b": "scenario b"},
        "summary": {
            "a": {
                "cpu_ms_per_msg": {"consumer": 2.5},
                "cpu_ms_by_thread": {**dict.fromkeys(ROLES), "callbacks": 1.25, "grpc": 0.5},
            },
            "b": {"cpu_ms_per_msg": {"consumer": 1.0}, "cpu_ms_by_thread": dict.fromkeys(ROLES)},
        },
    }
    lines = _thread_table(report)
    assert lines[0].startswith("| scenario | consumer CPU | callbacks | completer | writers")
    assert len(lines) == 3  # header, rule, scenario a (b has no reading)
    assert lines[2].startswith("| scenario a | 2.50 | 1.25 | n/a | n/a | n/a | 0.50 |")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_thread_handed_work_counts_its_switches_under_its_role() -> None:
    before = thread_switches()
    assert set(before) == set(ROLES)
    asked, answered = threading.Semaphore(0), threading.Semaphore(0)
    release = threading.Event()

    def serve() -> None:
        for _ in range(200):
            asked.acquire()
            answered.release()
        release.wait(10)  # alive when read

    thread = threading.Thread(target=serve, name="pubsub-worker-complete_0")
    thread.start()
    for _ in range(200):
        asked.release()
        assert answered.acquire(timeout=10)
    after = thread_switches()
    release.set()
    thread.join()
    # Each hand-off blocks the completer once it has answered (about 200 in all; more
    # when a busy machine preempts it or it waits for the GIL, never the process's count).
    assert 150 <= after["completer"] - before["completer"] <= 2000
    assert after["writers"] == before["writers"]  # no such thread: nothing counted


def test_a_phase_takes_each_roles_switches_apart_from_its_cpu() -> None:
    members: list[Any] = [
        SimpleNamespace(
            index=0,
            marks={
                "start": {"threads": {"callbacks": 1.0}, "switches": {"callbacks": 10}},
                "backlog": {"threads": {"callbacks": 2.0}, "switches": {"callbacks": 70}},
            },
        ),
    ]
    assert thread_delta(members, "start", "backlog", "switches") == {"callbacks": 60}
    assert thread_delta(members, "start", "backlog") == {"callbacks": 1.0}


def test_the_switch_table_shows_all_threads_and_each_role_per_message() -> None:
    report = {
        "scenarios": {"a": "scenario a", "b": "scenario b"},
        "summary": {
            "a": {
                "switches_by_thread": {
                    **dict.fromkeys(ROLES),
                    "all": 29.25,
                    "callbacks": 12.5,
                    "writers": 6.0,
                }
            },
            "b": {"switches_by_thread": {"all": None}},
        },
    }
    lines = _switch_table(report)
    assert lines[0].startswith("| scenario | all threads | callbacks | completer | writers")
    assert len(lines) == 3  # header, rule, scenario a (b has no reading)
    assert lines[2].startswith("| scenario a | 29.2 | 12.5 | n/a | 6.0 |")
