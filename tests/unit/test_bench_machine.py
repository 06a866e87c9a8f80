"""The benchmark's machine accounting: what the consumers, the emulators and other work took."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import machine
from benchmarks.machine import CpuMark, cpu_between, mark
from benchmarks.measure import cpu_shares
from benchmarks.report import _others

TICK = machine._CLK_TCK


def _mark(at: float, busy_s: float, total_s: float, stolen_s: float, firestore: float) -> CpuMark:
    return CpuMark(
        at=at,
        emulators={"firestore": firestore, "pubsub": 0.0},
        machine=(int(busy_s * TICK), int(total_s * TICK), int(stolen_s * TICK)),
        orchestrator=0.0,
    )


def test_other_work_is_what_the_benchmark_did_not_use_and_stolen_is_the_hypervisors_part() -> None:
    # 10 s on 2 cores: 12 s busy, of which the consumer 4, Firestore 3: others 5 s (0.5 cores),
    # 3 s of them stolen by the hypervisor (0.3 cores).
    before = _mark(100.0, 50.0, 200.0, 7.0, 20.0)
    after = _mark(110.0, 62.0, 220.0, 10.0, 23.0)
    consumer = SimpleNamespace(index=0, marks={"start": {"cpu_s": 1.0}, "backlog": {"cpu_s": 5.0}})
    shares = cpu_shares(before, after, [consumer])
    assert shares["other_load_cores"] == pytest.approx(0.5)
    assert shares["stolen_cores"] == pytest.approx(0.3)
    assert shares["machine_busy"] == pytest.approx(0.6)


def test_the_machine_counters_read_from_proc_move_forward_and_stolen_is_part_of_busy() -> None:
    first = mark({})
    second = mark({})
    busy, total, stolen = second.machine
    assert 0 <= stolen <= busy <= total
    spent = cpu_between(first, second)
    assert spent["stolen_s"] >= 0.0
    assert spent["machine_busy_s"] >= spent["stolen_s"]


def test_the_table_shows_others_with_the_stolen_part_when_the_run_measured_it() -> None:
    assert _others({"other_load_cores": 0.641, "stolen_cores": 0.6}) == "0.64 (0.60)"
    assert _others({"other_load_cores": 0.2, "stolen_cores": None}) == "0.20"  # older results
