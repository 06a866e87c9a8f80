"""``pubsub-worker run --processes 2``: two real worker processes under one supervisor.

The supervisor is the real command, started as a shell would; its children
run the crash-test handler (steps a, b, c; one effect line each, with the
pid). Jobs go to both processes and each step runs once; SIGTERM to the
supervisor stops both children gracefully; a child that dies is not
restarted: the other is stopped and the supervisor exits non-zero.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.chaos.conftest import LEASE_S
from tests.support.observe import assert_not_redelivered, job_document, step_epochs
from tests.support.processes import ROOT, Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

HANDLER = "tests.support.worker:handle_steps"


class Supervisor:
    def __init__(self, env: dict[str, str], log_path: Path, processes: int) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pubsub_worker.cli",
                    "run",
                    HANDLER,
                    "--processes",
                    str(processes),
                ],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, count: int = 1, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(re.findall(pattern, self.log())) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} x{count} not logged:\n{self.log()[-4000:]}")
            if self.process.poll() is not None:
                raise AssertionError(f"supervisor exited {self.process.returncode}:\n{self.log()}")
            time.sleep(0.1)

    def children(self) -> list[int]:
        return [
            int(pid)
            for pid in re.findall(r"worker process \d of \d started \(pid (\d+)\)", self.log())
        ]

    def kill_all(self) -> None:
        for pid in [*self.children(), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)


@pytest.fixture
def supervisor(tmp_path: Path) -> Any:
    started: list[Supervisor] = []

    def start(env: dict[str, str], processes: int = 2) -> Supervisor:
        made = Supervisor(env, tmp_path / f"supervisor-{len(started)}.log", processes)
        started.append(made)
        made.wait_for_log(r"consuming projects/", count=processes)
        return made

    yield start
    for made in started:
        made.kill_all()


def test_two_processes_share_one_subscription_each_job_once_and_sigterm_stops_both(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    supervisor: Any,
) -> None:
    env = {**worker_env, "PUBSUB_WORKER_MAX_MESSAGES": "3", "CHAOS_STEP_SLEEP_S": "0.1"}
    running = supervisor(env)
    children = running.children()
    assert len(children) == 2
    keys = [f"op-{n}" for n in range(24)]
    for key in keys:
        # One at a time: the emulator hands a burst to whichever stream polls first.
        publisher.publish(eod_subscription.topic_path, b"payload", op=key).result()
        time.sleep(0.15)
    effects.wait_until("c", len(keys), timeout_s=120)

    by_key = Counter((str(e["key"]), str(e["effect"])) for e in effects.read())
    assert by_key == Counter({(key, step): 1 for key in keys for step in ("a", "b", "c")})
    workers = Counter(int(str(e["pid"])) for e in effects.read() if e["effect"] == "c")
    assert set(workers) == set(children), f"jobs per process: {workers}"

    running.process.send_signal(signal.SIGTERM)
    assert running.process.wait(timeout=60) == 0
    log = running.log()
    assert "forwarding SIGTERM to 2 worker process(es)" in log
    assert log.count("stopping: no new messages") == 2
    assert "all 2 worker processes stopped" in log
    for key in keys:
        doc = job_document(
            firestore_client, firestore_collection, eod_subscription.subscription_path, key
        )
        assert (doc["status"], doc["epoch"], step_epochs(doc)) == (
            "completed",
            1,
            {"a": 1, "b": 1, "c": 1},
        )
    assert_not_redelivered(subscriber, eod_subscription.subscription_path, lease_s=LEASE_S)


def test_a_dead_process_is_not_restarted_the_other_is_stopped_and_the_exit_is_non_zero(
    worker_env: dict[str, str], supervisor: Any
) -> None:
    running = supervisor(worker_env)
    first, second = running.children()
    os.kill(first, signal.SIGKILL)

    assert running.process.wait(timeout=60) == 1
    log = running.log()
    assert (
        f"worker process 1 (pid {first}) exited with signal SIGKILL without a stop request; "
        "stopping the others (none is restarted)"
    ) in log
    assert "forwarding SIGTERM to 1 worker process(es)" in log
    assert log.count("stopping: no new messages") == 1
    assert len(running.children()) == 2  # none was started again
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)
