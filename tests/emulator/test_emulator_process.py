"""EmulatorProcess: start failures, timeouts, group kill, parent-death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emulator import EmulatorStartError
from emulator.process import EmulatorProcess, free_port
from tests.emulator.emulator_testutil import group_members, running, wait_gone


def _never_ready(address: str, timeout_s: float) -> None:
    raise ConnectionError(f"{address} not ready")


def test_exit_during_start_reports_status_and_log(tmp_path: Path) -> None:
    proc = EmulatorProcess.spawn(
        "fake",
        ["sh", "-c", "echo first line; echo the reason it died; exit 3"],
        host="127.0.0.1",
        port=free_port(),
        log_path=tmp_path / "fake.log",
    )
    with pytest.raises(EmulatorStartError) as info:
        proc.wait_ready(_never_ready, time.monotonic() + 10)
    proc.stop()
    message = str(info.value)
    assert "exited with status 3" in message
    assert "the reason it died" in message
    assert str(tmp_path / "fake.log") in message


def test_timeout_reports_last_log_lines(tmp_path: Path) -> None:
    proc = EmulatorProcess.spawn(
        "slow",
        ["sh", "-c", "echo warming up; exec sleep 60"],
        host="127.0.0.1",
        port=free_port(),
        log_path=tmp_path / "slow.log",
    )
    started = time.monotonic()
    with pytest.raises(EmulatorStartError) as info:
        proc.wait_ready(_never_ready, started + 0.5)
    assert time.monotonic() - started < 3
    assert "was not ready after" in str(info.value)
    assert "warming up" in str(info.value)
    proc.stop()
    assert not running(proc.pid)


def test_stop_kills_the_whole_group_even_if_term_is_ignored(tmp_path: Path) -> None:
    # Ignored signals are inherited: every process here ignores SIGTERM.
    script = "trap '' TERM; sleep 60 & sleep 60 & echo started; wait"
    proc = EmulatorProcess.spawn(
        "stubborn",
        ["sh", "-c", script],
        host="127.0.0.1",
        port=free_port(),
        log_path=tmp_path / "stubborn.log",
    )
    deadline = time.monotonic() + 5
    while len(group_members(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(group_members(proc.pid)) == 3
    started = time.monotonic()
    proc.stop(grace_s=0.3)
    assert time.monotonic() - started < 3
    assert group_members(proc.pid) == []
    assert not proc.alive()
    proc.stop()  # idempotent


def test_owner_killed_with_sigkill_leaves_no_child(tmp_path: Path) -> None:
    owner_code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from emulator.process import EmulatorProcess
        proc = EmulatorProcess.spawn(
            "orphan", ["sleep", "60"], host="127.0.0.1", port=1, log_path=Path(sys.argv[1])
        )
        print(proc.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", owner_code, str(tmp_path / "orphan.log")],
        stdout=subprocess.PIPE,
        text=True,
    ) as owner:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert running(child)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    assert wait_gone([child]) == []
