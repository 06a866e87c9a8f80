"""``python -m benchmarks.phases``: a delivery's Python calls, charged to its phases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pubsub_worker
from benchmarks import inprocess
from benchmarks.phases import PHASES, main, phase_calls


def test_every_phase_of_a_one_step_delivery_is_charged_and_counts_are_per_message() -> None:
    few, many = phase_calls(20), phase_calls(80)
    assert set(few) == set(PHASES)  # each phase ran, nothing charged elsewhere
    # The same path each time: per message, not in all (within a few calls: an OpenTelemetry
    # SDK another test set in this process records spans, whose bookkeeping varies a little).
    assert few == pytest.approx(many, rel=0.02)
    assert all(count >= 1 for count in few.values())
    assert 200 < sum(few.values()) < 2000


def test_the_step_s_calls_move_with_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    before = phase_calls(20)

    def three_steps(message: object, job: pubsub_worker.Job) -> None:
        for name in ("one", "two", "three"):
            job.step(name, lambda: 1)

    monkeypatch.setattr(inprocess, "_handler", three_steps)
    after = phase_calls(20)
    assert after["step"] > 2.5 * before["step"]
    assert after["claim"] == pytest.approx(before["claim"], rel=0.02)


def test_it_prints_each_phase_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--messages", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Calls per message by phase (10 one-step deliveries")
    rows = {line[10:]: float(line[:8]) for line in lines[1:]}
    assert set(rows) == {*PHASES, "in all"}
    assert rows["in all"] == pytest.approx(sum(v for k, v in rows.items() if k != "in all"), abs=1)


def test_it_runs_as_a_module_and_refuses_no_messages() -> None:
    command = [sys.executable, "-m", "benchmarks.phases", "--messages"]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [*command, "5"], capture_output=True, text=True, timeout=120, cwd=root, check=False
    )
    assert done.returncode == 0, done.stderr
    refused = subprocess.run(
        [*command, "0"], capture_output=True, text=True, timeout=120, cwd=root, check=False
    )
    assert refused.returncode == 2
    assert "--messages must be at least 1, got 0" in refused.stderr
