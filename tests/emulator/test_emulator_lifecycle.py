"""Starting and stopping real emulators: nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import emulator.emulators as emulators_module
from emulator import Emulators, start_emulators
from emulator.probes import pubsub_ready
from emulator.process import free_port, listens_on
from tests.emulator.emulator_testutil import children, cmdline, group_members, running, wait_gone

pytestmark = pytest.mark.emulator


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    emu = start_emulators("lifecycle-test", log_dir=tmp_path, timeout_s=60)
    pids = list(emu.pids.values())
    try:
        assert len(pids) == 2
        for pid in pids:
            assert running(pid)
            assert "java" in cmdline(pid)
            assert group_members(pid) == [pid]  # the JVM is its own group, no launcher
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            p.name for p in emu.log_paths.values()
        )
        assert "Server started" in emu.log_paths["pubsub"].read_text()
    finally:
        emu.stop()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
        assert group_members(pid) == []
    assert not emu.alive()
    emu.stop()  # idempotent


def _read_until_ready(proc: subprocess.Popen[str], timeout_s: float) -> list[str]:
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready in"):
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout_s)
    return lines


def test_cli_up_prints_exports_and_stops_on_sigint(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "emulator", "up", "--project", "cli-test-project"]
    command += ["--log-dir", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            lines = _read_until_ready(proc, 60)
            assert lines, "no output"
            assert re.fullmatch(r"ready in \d+\.\d s \(.*\); Ctrl-C to stop", lines[-1]), lines
            exports = {
                key: value
                for key, _, value in (
                    line.removeprefix("export ").partition("=")
                    for line in lines
                    if line.startswith("export ")
                )
            }
            assert exports["GOOGLE_CLOUD_PROJECT"] == "cli-test-project"
            assert set(exports) == {
                "PUBSUB_EMULATOR_HOST",
                "FIRESTORE_EMULATOR_HOST",
                "GOOGLE_CLOUD_PROJECT",
            }
            assert "# topic projects/cli-test-project/topics/jobs" in lines
            pubsub_ready(exports["PUBSUB_EMULATOR_HOST"], 5)
            jvms = children(proc.pid)
            assert len(jvms) == 2
            assert all("java" in cmdline(pid) for pid in jvms)
        finally:
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert rest.splitlines()[-1] == "stopped"
    assert wait_gone(jvms, timeout_s=1) == []
    assert all(group_members(pid) == [] for pid in jvms)


def test_cli_sigterm_also_stops(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "emulator", "up", "--no-topology"]
    command += ["--log-dir", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        lines = _read_until_ready(proc, 60)
        jvms = children(proc.pid)
        proc.terminate()
        proc.communicate(timeout=30)
    assert lines[-1].startswith("ready in")
    assert not any(line.startswith("# topic") for line in lines)
    assert proc.returncode == 0
    assert len(jvms) == 2
    assert wait_gone(jvms, timeout_s=1) == []


def test_ctrl_c_during_a_test_run_leaves_no_jvm(tmp_path: Path) -> None:
    # An interpreter interrupted with KeyboardInterrupt still stops its
    # emulators (context manager, then atexit as the safety net).
    code = (
        "import os, signal, sys, time\n"
        "from emulator import start_emulators\n"
        "emu = start_emulators('ctrl-c-test', firestore=False, log_dir=sys.argv[1])\n"
        "print(emu.pids['pubsub'], flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        jvm = int(proc.stdout.readline())
        assert running(jvm)
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode != 0  # died of the KeyboardInterrupt
    assert time.monotonic() - started < 10
    assert wait_gone([jvm], timeout_s=1) == []


def test_port_taken_by_another_emulator_is_detected_and_retried(
    emulators: Emulators,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The first port handed out belongs to the session's Pub/Sub emulator: it
    # answers the probe, but the new JVM cannot bind it. The harness must not
    # take the other emulator for its own.
    assert emulators.pubsub_host is not None
    taken = int(emulators.pubsub_host.rpartition(":")[2])
    ports = iter([taken])
    monkeypatch.setattr(
        emulators_module, "free_port", lambda host: next(ports, None) or free_port(host)
    )
    with caplog.at_level("WARNING", logger="emulator.emulators"):
        emu = start_emulators("port-test", firestore=False, log_dir=tmp_path, timeout_s=60)
    try:
        assert emu.pubsub_host is not None
        assert emu.pubsub_host != emulators.pubsub_host
        assert listens_on(emu.pids["pubsub"], int(emu.pubsub_host.rpartition(":")[2]))
        assert "lost its port" in caplog.text
        assert emu.ready_s["pubsub"] < 30
    finally:
        emu.stop()
