"""The machine-steadiness check: a fixed chunk of Python timed per second on each core."""

from __future__ import annotations

import os

import pytest

from benchmarks import speed


def test_a_chunk_costs_cpu_time_and_each_second_gets_its_median() -> None:
    assert speed.chunk_ms() > 0
    medians = speed.spells(2.2)
    assert len(medians) == 2  # whole seconds only
    assert all(m > 0 for m in medians)


def test_every_core_is_timed_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert speed.main(["--seconds", "1.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cores = sorted(os.sched_getaffinity(0))
    assert [line.split(":")[0] for line in lines[1:]] == [f"core {c}" for c in cores]
    assert all("no figure" not in line for line in lines)
