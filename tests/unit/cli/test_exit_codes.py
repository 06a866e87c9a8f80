"""``pubsub-worker``'s failures before any service answers: one line on stderr and its exit code.

Each runs the real command (``python -m pubsub_worker.cli``) in a child process with
the emulators' addresses pointing at a closed port: what is checked here must fail
before any connection, or (the store down) fail with one line after its retries.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pubsub_worker.cli
from pubsub_worker._support.distribution import NAME, installed_version
from pubsub_worker.cli.exit_codes import ExitCode
from tests.support.processes import ROOT, run_cli

CLOSED = "127.0.0.1:9"
"""Nothing listens here (the discard port): a client gets 'connection refused'."""

BASE = {
    "PATH": os.environ.get("PATH", ""),
    "PUBSUB_WORKER_SUBSCRIPTION": "projects/p/subscriptions/orders",
    "PUBSUB_EMULATOR_HOST": CLOSED,
    "FIRESTORE_EMULATOR_HOST": CLOSED,
    # As pyproject's pytest filters: google-api-core announces the end of its support for
    # Python 3.10 on import, a line of its own that is not the command's (compat runs 3.10).
    "PYTHONWARNINGS": "ignore::FutureWarning",
}


def one_line(stderr: str) -> str:
    """The one line a failure writes; fails the test on a traceback or a second line."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pubsub-worker: "), stderr
    return lines[0]


def test_every_exit_code_is_in_the_documented_tables() -> None:
    documented = {
        int(code) for code in re.findall(r"^(\d+)  ", pubsub_worker.cli.__doc__ or "", re.M)
    }
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = operations.split("| code | meaning |", 1)[1].split("\n\n", 1)[0]
    in_docs = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == in_docs == {int(code) for code in ExitCode}


def test_version_names_the_command_the_distribution_and_python() -> None:
    done = run_cli(BASE, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"pubsub-worker {installed_version()} ({NAME}, Python 3.")
    assert done.stderr == ""


def test_a_usage_error_is_one_line_naming_the_help_and_exit_2() -> None:
    done = run_cli(BASE, "jobs", "list", "--status", "stuck")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "argument --status: invalid choice: 'stuck'" in line
    assert line.endswith("(see pubsub-worker jobs list --help)")
    done = run_cli(BASE, "jobs", "frobnicate")
    assert (done.returncode, "invalid choice: 'frobnicate'" in one_line(done.stderr)) == (2, True)
    done = run_cli(BASE, "run", "m:h", "--metrics-port", "70000")
    assert done.returncode == 2
    assert "'70000': expected a port, 0 to 65535" in one_line(done.stderr)


def test_an_unknown_setting_or_a_bad_flag_value_names_it_and_exit_2() -> None:
    done = run_cli({**BASE, "PUBSUB_WORKER_LEASE_SECONDS": "3"}, "jobs", "list")
    assert done.returncode == 2
    assert "PUBSUB_WORKER_LEASE_SECONDS" in one_line(done.stderr)
    done = run_cli(BASE, "jobs", "list", "--subscription", "not/a path")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith("pubsub-worker: --subscription='not/a path': accepted: "), line
    done = run_cli(BASE, "jobs", "list", "--subscription", "orders", "--project", "Bad_Project")
    assert done.returncode == 2
    assert "--project" in one_line(done.stderr)


HANDLERS = {
    "raises.py": "raise RuntimeError('no database configured')\n",
    "values.py": "HANDLE = 42\n",
}


@pytest.mark.parametrize(
    ("command", "spec", "why"),
    [
        (
            "run",
            "handlers_nowhere:handle",
            "cannot import 'handlers_nowhere': No module named 'handlers_nowhere'",
        ),
        ("run", "raises:handle", "importing 'raises' failed: RuntimeError: no database configured"),
        ("run", "values:missing", "values has no 'missing'"),
        ("run", "values:HANDLE", "values.HANDLE is a int, not a function taking (message, job)"),
        ("run", "values", "expected 'package.module:function'"),
        ("push", "values:HANDLE", "values.HANDLE is a int, not a function taking (message, job)"),
    ],
)
def test_a_bad_handler_path_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, command: str, spec: str, why: str
) -> None:
    for name, text in HANDLERS.items():
        (tmp_path / name).write_text(text)
    env = {**BASE, "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pubsub_worker.cli", command, spec, "--processes", "2"]
        if command == "run"
        else [sys.executable, "-m", "pubsub_worker.cli", command, spec],
        cwd=tmp_path,  # a handler module is looked up in the working directory too
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) == f"pubsub-worker: handler {spec!r}: {why}"


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process (this test) listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "tests.support.worker:handle_steps", "--metrics-port"], "--metrics-port"),
        (["push", "samples.cloud_run.handler:handle", "--port"], "--port"),
        (
            ["push", "samples.cloud_run.handler:handle", "--port", "0", "--metrics-port"],
            "--metrics-port",
        ),
    ],
    ids=["run-metrics", "push", "push-metrics"],
)
def test_a_port_in_use_is_one_line_and_exit_2(taken_port: int, argv: list[str], flag: str) -> None:
    env = {**BASE, "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false"}
    host = ["--metrics-host", "127.0.0.1"] if flag == "--metrics-port" else ["--host", "127.0.0.1"]
    done = run_cli(env, *argv, str(taken_port), *host)
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) == (
        f"pubsub-worker: {flag} {taken_port}: cannot listen on 127.0.0.1:{taken_port}: address "
        "already in use (another process listens there; pick another port, or 0 for any free one)"
    )


def test_the_store_down_is_one_line_and_exit_3() -> None:
    started = time.monotonic()
    done = run_cli(BASE, "jobs", "show", "order-1")
    assert done.returncode == 3
    assert one_line(done.stderr).startswith(
        f"pubsub-worker: Firestore did not answer: the emulator at {CLOSED} "
        "(FIRESTORE_EMULATOR_HOST); is it running?"
    )
    assert done.stdout == ""
    assert time.monotonic() - started < 40  # bounded retries, not the client's minutes


def test_ctrl_c_is_one_line_and_exit_130() -> None:
    # A store that never answers (a listener that accepts and says nothing) holds the
    # command in its first read; Ctrl-C then ends it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {**BASE, "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{silent.getsockname()[1]}"}
        process = subprocess.Popen(
            [sys.executable, "-m", "pubsub_worker.cli", "jobs", "list"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        silent.settimeout(60)
        connection, _ = silent.accept()  # started, and waiting for Firestore's answer
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
        connection.close()
    assert process.returncode == 130, err
    assert one_line(err) == "pubsub-worker: interrupted"
    assert out == ""


def test_an_error_raised_by_a_ctrl_c_on_its_way_out_is_the_interrupt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On Python 3.10 a Ctrl-C inside a gRPC call's ``Condition.wait`` can surface as
    ``RuntimeError: cannot release un-acquired lock``, the interrupt as its context."""

    def interrupted_in_a_lock(*_: object, **__: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock") from None

    def failing(*_: object, **__: object) -> None:
        raise RuntimeError("cannot release un-acquired lock")

    monkeypatch.setattr(pubsub_worker.cli.jobs, "cmd_list", interrupted_in_a_lock)
    assert pubsub_worker.cli.main(["jobs", "list"]) == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "pubsub-worker: interrupted\n"
    monkeypatch.setattr(pubsub_worker.cli.jobs, "cmd_list", failing)
    assert pubsub_worker.cli.main(["jobs", "list"]) == ExitCode.INTERNAL  # no interrupt: a bug
