"""``benchmarks.cores``: the consumer on a core of its own, the emulators and harness apart."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.cores import ENV, Layout, pin_self_from_env, pin_tree

CPUS = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CPUS) < 2, reason="the split layout needs two cores")


def test_the_consumer_gets_the_last_core_and_the_rest_the_others() -> None:
    layout = Layout.split([3, 0, 1, 2])
    assert layout == Layout(consumer=frozenset({3}), rest=frozenset({0, 1, 2}))
    assert layout.every == frozenset({0, 1, 2, 3})
    assert layout.consumer_env() == {ENV: "3"}
    assert "core 3" in layout.describe()
    assert "core 0, 1, 2" in layout.describe()


def test_one_core_has_no_split() -> None:
    assert Layout.split([5]) is None
    assert Layout.split([]) is None


def _sleeper() -> subprocess.Popen[bytes]:
    """A process with a child of its own: a tree to move."""
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as file:
        return [int(child) for child in file.read().split()]


@two_cores
def test_a_process_and_its_descendants_move_every_thread() -> None:
    parent = _sleeper()
    try:
        deadline = time.monotonic() + 30
        while not _children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # its child starting
        (child,) = _children(parent.pid)
        target = frozenset(CPUS[:1])
        moved = pin_tree(parent.pid, target)
        assert moved >= 2
        for pid in (parent.pid, child):
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(tid)) == target
    finally:
        for pid in _children(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_a_gone_process_moves_nothing() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert pin_tree(done.pid, frozenset(CPUS)) == 0


@two_cores
def test_a_consumer_pins_itself_to_the_cores_the_variable_names() -> None:
    code = (
        "import os, threading; from benchmarks.cores import pin_self_from_env\n"
        "go = threading.Event(); t = threading.Thread(target=go.wait); t.start()\n"
        "print(sorted(pin_self_from_env())); print(sorted(os.sched_getaffinity(0)))\n"
        "print(sorted(os.sched_getaffinity(t.native_id))); go.set()"  # started before: moved
    )
    wanted = str(CPUS[-1])
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, ENV: wanted},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [f"[{wanted}]"] * 3


def test_without_the_variable_or_with_no_usable_core_nothing_moves() -> None:
    assert pin_self_from_env({}) is None
    assert pin_self_from_env({ENV: " "}) is None
    assert pin_self_from_env({ENV: str(max(CPUS) + 1000)}) is None
    assert sorted(os.sched_getaffinity(0)) == CPUS


def test_a_run_keeps_the_layout_only_if_every_consumer_reported_its_core() -> None:
    layout = Layout(consumer=frozenset({1}), rest=frozenset({0}))
    assert layout.kept_by([[1]])
    assert not layout.kept_by([[0]])
    assert not layout.kept_by([[0, 1]])
    assert not layout.kept_by([None])  # a consumer that never said
