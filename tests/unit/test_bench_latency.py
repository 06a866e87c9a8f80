"""The production-latency group's figures and targets, from made-up runs (no emulator)."""

from __future__ import annotations

from typing import Any

import pytest

import pubsub_worker
from benchmarks.latency import added_ms, latency_section, latency_targets
from benchmarks.report import summarize
from benchmarks.scenarios import SCENARIOS

NAMES = ("stock-eod-default-rtt", "wrapped-1-default-rtt", "run-1-rtt")


def _run(name: str, repeat: int, msgs_per_s: float, p50: float, p99: float) -> dict[str, Any]:
    return {
        "scenario": name,
        "repeat": repeat,
        "ok": True,
        "phases": {
            "backlog": {
                "msgs_per_s": msgs_per_s,
                "callback_ms": {"mean": 40.0},
                "slot_ms": {"mean": 60.0},
            },
            "paced": {"latency_ms": {"p50": p50, "p99": p99}},
            "lone": {
                "latency_ms": {"p50": p50},
                "callback_ms": {"p50": 30.0},
                "slot_ms": {"p50": 50.0},
                "firestore_rpcs_per_msg": 2.0 if name != NAMES[0] else 0.0,
                "firestore_rpc_ms_per_msg": 22.0 if name != NAMES[0] else 0.0,
            },
        },
    }


def _report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": runs,
        "summary": summarize(runs, NAMES, 10),
        "scenarios": {name: name for name in NAMES},
        "options": {"firestore_rtt_ms": 10.0, "pubsub_rtt_ms": 20.0, "paced": 200, "rate": 50},
    }


RUNS = [
    # stock at its defaults: p50 100, 110, 200 ms over three repeats
    _run(NAMES[0], 1, 250.0, 100.0, 150.0),
    _run(NAMES[0], 2, 240.0, 110.0, 160.0),
    _run(NAMES[0], 3, 100.0, 200.0, 300.0),
    # the wrapped callback: adds 18, 25, 5 ms at p50 (median 18; its p50s' median is 25 more)
    _run(NAMES[1], 1, 240.0, 118.0, 170.0),
    _run(NAMES[1], 2, 230.0, 135.0, 190.0),
    _run(NAMES[1], 3, 95.0, 205.0, 330.0),
    # run(): 60% of the stock client's throughput in every repeat, adds 30 ms
    _run(NAMES[2], 1, 150.0, 130.0, 200.0),
    _run(NAMES[2], 2, 144.0, 140.0, 210.0),
    _run(NAMES[2], 3, 60.0, 230.0, 340.0),
]


def test_added_latency_is_taken_within_each_repeat() -> None:
    report = _report(RUNS)
    assert added_ms(report, NAMES[1]) == 18.0  # not 135 - 110 = 25, the medians' difference
    assert added_ms(report, NAMES[1], "p99") == 30.0
    assert added_ms(report, NAMES[2]) == 30.0
    assert added_ms(_report(RUNS[:3]), NAMES[1]) is None  # no wrapped run


def test_the_targets_judge_throughput_at_the_defaults_and_the_added_latency() -> None:
    wrapped, run, latency = latency_targets(_report(RUNS))
    assert wrapped["met"] is True  # 96% of the stock client in the median repeat
    assert wrapped["measured"] == "96% (95-96)"
    assert run["met"] is False
    assert run["measured"] == "60%"
    assert run["stands"] == (  # run()'s callback threads are not timed: no thread bound
        "`run-1-rtt`: 40 flow-control slots, each held 60.0 ms from receipt to the ack's "
        "answer: at most 667; measured 144"
    )
    assert "p50 <= two Firestore round trips as paid" in latency["target"]
    assert latency["met"] is False  # run() adds 30 ms, over 2 x 11 + 2
    assert latency["measured"].startswith(
        "`wrapped-1-default-rtt` 18.0 ms (p99 30.0; a Firestore RPC answered in 11.0 ms: "
        "limit 24.0)"
    )
    assert latency["stands"].startswith("lone `run-1-rtt`: 50.0 ms from its callback's start")


def test_the_added_latency_limit_is_two_round_trips_as_paid() -> None:
    """A lone RPC's answer time (delay, emulator, client); the proxy's delay without one."""
    runs = [*RUNS[:3], *(_run(NAMES[1], n, 240.0, p50, 170.0) for n, p50 in [(1, 123.0)])]
    runs[3]["phases"]["lone"]["firestore_rpc_ms_per_msg"] = 26.0  # 13 ms per RPC: limit 28
    latency = latency_targets(_report(runs))[2]
    assert latency["met"] is True  # adds 23 ms: over 2 x 10 + 2, within 2 x 13 + 2
    assert latency["measured"].endswith("answered in 13.0 ms: limit 28.0)")
    del runs[3]["phases"]["lone"]
    latency = latency_targets(_report(runs))[2]
    assert latency["met"] is False  # no lone phase: the proxy's 10 ms stand in
    assert latency["measured"].endswith("answered in n/a ms: limit 22.0)")


def test_a_missed_target_names_the_machine_s_bound_when_the_cpu_figures_are_there() -> None:
    runs = [*RUNS[:3], *(_run(NAMES[1], n, rate, 120.0, 170.0) for n, rate in [(1, 150.0)])]
    report = _report(runs)
    report["machine"] = {"cpus": 2}
    row = report["summary"][NAMES[1]]
    row["cpu_ms_per_msg"] = {"consumer": 2.5, "firestore_emulator": 4.5, "pubsub_emulator": 1.0}
    row["other_load_cores"], row["machine_busy"] = 0.4, 0.85
    wrapped = latency_targets(report)[0]
    assert wrapped["met"] is False
    assert wrapped["stands"] == (
        "`wrapped-1-default-rtt`: 10 callback threads, each busy 40.0 ms per message: at most "
        "250 msg/s; 1000 flow-control slots, each held 60.0 ms from receipt to the ack's "
        "answer: at most 16,667; the machine: 8.0 ms of CPU per message in the consumer and "
        "both emulators (2.5 + 4.5 + 1.0), 1.60 of its 2 cores left by other work: at most "
        "200 (85% busy); measured 150"
    )


def test_the_targets_are_not_judged_without_their_scenarios() -> None:
    targets = latency_targets(_report(RUNS[:3]))
    assert [t["met"] for t in targets] == [None, None, None]
    assert [t["measured"] for t in targets] == ["n/a", "n/a", "n/a"]


def test_the_section_has_a_row_per_delayed_scenario_and_none_without_them() -> None:
    lines = latency_section(_report(RUNS))
    assert "([how, and why these figures](benchmarks.md#why-latency))" in lines[3]
    rows = [line for line in lines if line.startswith("| run-1-rtt") or line.startswith("| wr")]
    assert rows[0].startswith("| wrapped-1-default-rtt | n/a (1000) / 10 | 230 | 96% | 96% ")
    assert "| 18.0 / 30.0 |" in rows[0]
    assert rows[1].startswith("| run-1-rtt | n/a (40) / 20 | 144 | 60% | 60% ")
    report = _report(RUNS)
    report["summary"] = {"stock-eod": report["summary"][NAMES[0]]}
    assert latency_section(report) == []


def test_a_run_scenario_with_more_threads_sets_them_in_its_consumers_and_admits_twice() -> None:
    default, fewer = SCENARIOS["run-1-rtt"], SCENARIOS["run-1-rtt-10"]
    assert default.env() == {}
    assert (default.threads(10), default.in_flight(10)) == (20, 40)  # and as many prefetched
    assert fewer.env() == {"PUBSUB_WORKER_MAX_MESSAGES": "10"}
    assert (fewer.threads(10), fewer.in_flight(10)) == (10, 20)
    assert (fewer.delayed, fewer.baseline) == (True, "stock-eod-default-rtt")


@pytest.mark.parametrize("name", sorted(n for n, s in SCENARIOS.items() if s.env()))
def test_what_a_scenario_sets_in_its_consumers_is_a_valid_configuration(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in SCENARIOS[name].env().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "projects/bench/subscriptions/bench")
    pubsub_worker.Settings()  # a scenario whose consumers would refuse to start fails here
