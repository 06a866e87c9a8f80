"""A benchmark session's runs: when the emulators count as settled before the warm-ups, and
each run's backlog (no emulator)."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.report import render_markdown
from benchmarks.run import (
    PROFILE_ROUND,
    backlog_of,
    parse_args,
    run_order,
    scenario_backlog,
    settle_emulators,
    settled,
)
from benchmarks.scenarios import SCENARIOS
from benchmarks.targets import CPU_COMPARED


def test_settled_once_three_runs_in_a_row_cost_the_emulator_within_15_percent() -> None:
    assert not settled([])
    assert not settled([1.0, 1.0])  # two runs are not enough
    assert not settled([11.2, 6.9, 5.9])  # a step of 15% is still a step
    assert not settled([11.2, 6.9, 5.9, 3.4, 1.7, 1.6])
    assert settled([11.2, 6.9, 5.9, 3.4, 1.7, 1.6, 1.8])
    assert settled([1.0, 1.14, 1.07])
    assert not settled([1.0, 1.16, 1.07])  # highest over lowest
    assert not settled([0.0, 0.0, 0.0])  # no figure to compare


def test_settling_stops_once_settled_at_a_failed_run_or_at_the_limit() -> None:
    def runs(*costs: float | None) -> Callable[[], float | None]:
        figures = iter(costs)
        return lambda: next(figures)

    jit = (11.2, 6.9, 5.9, 3.4, 1.7, 1.6, 1.8, 9.9)
    assert settle_emulators(runs(*jit), 8) == [11.2, 6.9, 5.9, 3.4, 1.7, 1.6, 1.8]
    assert settle_emulators(runs(*jit), 4) == [11.2, 6.9, 5.9, 3.4]
    assert settle_emulators(runs(11.2, None, 1.0), 8) == [11.2]
    assert settle_emulators(runs(), 0) == []


def test_a_full_run_settles_at_most_12_times_a_quick_one_not_at_all() -> None:
    assert parse_args([]).settle == 12
    assert parse_args(["--quick"]).settle == 0
    assert parse_args(["--settle", "3"]).settle == 3
    assert parse_args(["--settle", "-1"]).settle == 0


def test_the_profile_round_runs_a_backlog_long_enough_to_sample() -> None:
    full = parse_args([])
    assert (full.messages, full.warmup, full.profile_messages) == (1500, 600, 9000)
    assert backlog_of(full, 0) == 600  # the warm-up
    assert backlog_of(full, 3) == 1500  # a measured repeat
    assert backlog_of(full, PROFILE_ROUND) == 9000
    assert backlog_of(full, PROFILE_ROUND - 1) == 1500  # a settling run
    assert parse_args(["--quick"]).profile_messages == 600
    assert backlog_of(parse_args(["--profile-messages", "2000"]), PROFILE_ROUND) == 2000


def test_each_process_of_a_fleet_gets_a_lone_consumers_backlog() -> None:
    assert scenario_backlog(1500, SCENARIOS["wrapped-1"]) == 1500
    for name, processes in (("p2", 2), ("p4", 4)):
        for fleet in (f"stock-eod-{name}", f"wrapped-1-{name}", f"run-{name}"):
            assert SCENARIOS[fleet].processes == processes
            assert scenario_backlog(1500, SCENARIOS[fleet]) == 1500 * processes
    assert scenario_backlog(1500, SCENARIOS["wrapped-1-1m"]) == 150  # its share
    assert scenario_backlog(20, SCENARIOS["wrapped-1-1m"]) == 10  # never under 10


def test_the_report_says_the_backlog_is_per_process_only_for_runs_that_had_it() -> None:
    per_process = "1500 messages of 256 bytes per consumer process published first"
    assert per_process in render_markdown({**_report([]), "backlog_per_process": True})
    earlier = render_markdown(_report([]))  # a run from before: one backlog for the fleet
    assert per_process not in earlier
    assert "1500 messages of 256 bytes published first" in earlier


def test_the_report_says_how_the_emulators_settled() -> None:
    report = _report([5.94, 3.2, 1.13, 1.07])
    assert (
        "First 4 discarded run(s) of `wrapped-1` settled the emulators (the Firestore "
        "emulator's CPU per message, run by run: 5.94, 3.20, 1.13, 1.07 ms). A warm-up run"
    ) in render_markdown(report)
    assert "settled the emulators" not in render_markdown(_report([]))


def test_the_report_says_when_the_emulators_had_not_settled_at_the_limit() -> None:
    costs = [7.0, 2.75, 3.0, 2.61, 2.19, 1.85, 1.69, 1.06]
    assert not settled(costs)
    text = render_markdown(_report(costs, done=False))
    assert (
        "First 8 discarded run(s) of `wrapped-1` did **not** settle the emulators (the "
        "Firestore emulator's CPU per message, run by run: 7.00, 2.75, 3.00, 2.61, 2.19, 1.85, "
        "1.69, 1.06 ms)"
    ) in text
    assert "settled the emulators" not in text


def _report(settling: list[float], *, done: bool = True) -> dict[str, object]:
    return {
        "command": "python -m benchmarks.run",
        "date": "2026-12-03T08:00:00+00:00",
        "duration_s": 60.0,
        "machine": {"cpus": 2, "cpu_model": "x", "python": "3.11", "platform": "linux"},
        "versions": {},
        "code": "commit abc",
        "options": {
            "messages": 1500,
            "paced": 200,
            "rate": 100.0,
            "lone": 20,
            "concurrency": 10,
            "repeats": 5,
        },
        "scenarios": {},
        "summary": {},
        "runs": [],
        "warmups": [],
        "settling": settling,
        "settled": done,
        "profiled": {},
        "targets": [],
    }


def test_the_cpu_targets_scenarios_run_15_times_the_others_as_often_as_asked() -> None:
    assert parse_args([]).cpu_repeats == 15
    assert parse_args(["--quick"]).cpu_repeats == 0
    assert parse_args(["--repeats", "3"]).cpu_repeats == 0  # as often as the others
    options = parse_args(
        [
            *("--scenarios", "stock-eod,wrapped-1,wrapped-3,wrapped-1-memory"),
            *("--repeats", "2", "--cpu-repeats", "15"),
        ]
    )
    order = run_order(options.scenarios, options)
    counts = {name: sum(1 for n, _ in order if n == name) for name in options.scenarios}
    assert counts == {"stock-eod": 15, "wrapped-1": 15, "wrapped-1-memory": 15, "wrapped-3": 2}
    # The first repeats as before: every scenario, the order rotated by one each repeat.
    assert order[: 2 * len(options.scenarios)] == [
        *((name, 1) for name in options.scenarios),
        *((name, 2) for name in [*options.scenarios[1:], options.scenarios[0]]),
    ]
    # Then each extra repeat runs every compared scenario once, its stock baseline with it.
    for repeat in range(3, 16):
        ran = sorted(name for name, r in order if r == repeat)
        assert ran == ["stock-eod", "wrapped-1", "wrapped-1-memory"]
    assert {name for name, r in order if r > 2} <= CPU_COMPARED


def test_no_extra_repeats_without_the_cpu_targets_scenarios_or_past_their_count() -> None:
    fleet = parse_args(["--scenarios", "wrapped-3", "--repeats", "3", "--cpu-repeats", "9"])
    assert [r for _, r in run_order(fleet.scenarios, fleet) if r > 3] == []
    stock = parse_args(["--scenarios", "stock-eod-default", "--repeats", "2", "--cpu-repeats", "9"])
    assert [r for _, r in run_order(stock.scenarios, stock) if r > 2] == []
    fewer = parse_args(["--scenarios", "wrapped-1", "--repeats", "5", "--cpu-repeats", "3"])
    assert max(r for _, r in run_order(fewer.scenarios, fewer)) == 5
