"""Start real worker processes and read what they did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (``T``), or gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return True
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        state = stat.rsplit(")", 1)[1].split()[0]
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def run_cli(env: Mapping[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m pubsub_worker.cli ARGV`` with ``env``, bounded; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pubsub_worker.cli", *argv],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass
class Worker:
    """A worker process; its log (JSON lines on stderr) goes to a file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pause(self) -> None:
        """SIGSTOP, then wait until every thread is stopped: the signal is asynchronous.

        Without the wait, a thread running on another core can take one more
        step after ``pause`` returned (pass a gate the test opens next).
        """
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _stopped(self.pid):
            if time.monotonic() > deadline:
                raise AssertionError(f"process {self.pid} did not stop within 10 s")
            time.sleep(0.002)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self, timeout_s: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def wait_for_log(self, text: str, *more: str, timeout_s: float = 30) -> None:
        """Wait until the log holds ``text`` (or any of ``more``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.log()
            if any(t in log for t in (text, *more)):
                return
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited ({self.process.returncode}):\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not logged within {timeout_s} s:\n{self.log()[-4000:]}")


@dataclass
class Effects:
    """The effects file shared by the workers of one test."""

    path: Path
    lines: list[dict[str, object]] = field(default_factory=list)

    def read(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def count(self, effect: str | None = None, key: str | None = None) -> int:
        return sum(
            1
            for line in self.read()
            if (effect is None or line["effect"] == effect) and (key is None or line["key"] == key)
        )

    def by_effect(self) -> Counter[str]:
        return Counter(str(line["effect"]) for line in self.read())

    def wait_until(self, effect: str, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count(effect) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"{effect!r} seen {self.count(effect)} times, wanted {count}")


def start_worker(
    env: Mapping[str, str],
    log_path: Path,
    name: str = "worker",
    *,
    module: str = "tests.support.worker",
) -> Worker:
    """``python -m MODULE`` (a worker of tests/support) with ``env`` on top of this process's
    environment; returns once it logged that it is ready."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=full_env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    log_file.close()
    worker = Worker(process, log_path)
    worker.wait_for_log('"worker": "ready"')
    return worker


def stop_all(workers: Iterator[Worker] | list[Worker]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            try:
                os.kill(worker.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            worker.kill()
