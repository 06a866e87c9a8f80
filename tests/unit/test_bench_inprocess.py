"""``python -m benchmarks.inprocess``: the library's own Python per message, no I/O."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.inprocess import Side, main, run_once, run_threaded


def test_one_thread_acks_every_message_and_reports_cpu() -> None:
    assert run_once(50) > 0


@pytest.mark.parametrize("side", ["stock", "wrapped", "floor"])
def test_callback_threads_ack_every_message_answered_by_another_thread(side: Side) -> None:
    # run_threaded raises unless every message was acked and every ack answered
    assert run_threaded(60, 3, side=side).cpu_ms > 0


def test_the_in_memory_store_sends_no_rpc_and_switches_are_counted() -> None:
    run = run_threaded(20, 2, side="wrapped")
    assert run.rpcs == 0
    assert run.switches >= 0


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are read from /proc")
def test_cpu_and_switches_are_told_by_thread_role_the_callbacks_their_own() -> None:
    run = run_threaded(200, 2, side="wrapped")
    assert run.cpu_ms_by_role["callbacks"] > 0  # the lab's pool is the callback threads
    assert run.cpu_ms_by_role["writers"] == 0  # the in-memory store has no batch writers


def test_more_in_flight_than_threads_acks_every_message() -> None:
    # the pool's queue holds what the threads have not taken yet, as at the client's defaults
    assert run_threaded(60, 2, side="wrapped", in_flight=20).cpu_ms > 0


def test_the_report_names_what_is_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--threads", "2", "--in-flight", "8", "--messages", "30", "--repeats", "1"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("2 callback thread(s), up to 8 in flight, 30 ")


def test_side_by_side_prints_both_and_the_wrapper_s_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--threads", "2", "--messages", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 callback thread(s), 40 messages, medians of 1: stock ")
    assert "wrapped " in out
    assert "the wrapper's own " in out
    if Path("/proc/self/task").is_dir():
        assert "the wrapper by thread, CPU ms / context switches per message: callbacks " in out


def test_it_runs_as_a_module() -> None:
    command = [sys.executable, "-m", "benchmarks.inprocess", "--threads", "2"]
    done = subprocess.run(
        [*command, "--messages", "30", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("2 callback thread(s), 30 messages")


def test_emptied_caches_time_only_the_messages_and_ack_every_one() -> None:
    # run_once raises unless every message was acked
    assert run_once(20, evict_mb=1) > 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--evict", "-1"], "--evict must be >= 0 MB, got -1"),
        (["--evict", "8", "--threads", "2"], "not with --threads"),
        (["--threads", "2", "--in-flight", "0"], "--in-flight must be at least 1, with --threads"),
        (["--in-flight", "5"], "--in-flight must be at least 1, with --threads; got 5"),
    ],
)
def test_bad_evict_values_are_refused_by_name(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
