"""The report's cost targets: each judged on its own scenarios, against its own limit."""

from __future__ import annotations

from typing import Any

from benchmarks.report import _cpu_repeats, _targets_table
from benchmarks.targets import BEST_FLOOR, evaluate


def _row(baseline: str, cpu: float, ratio: float | None = None, **more: Any) -> dict[str, Any]:
    return {
        "baseline": baseline,
        "cpu_ms_per_msg": {"consumer": cpu},
        "cpu_ratio_vs_baseline": ratio,
        "ratio_vs_baseline": {"median": 1.0, "min": 1.0, "max": 1.0},
        "lone_slot_ms": more.get("lone_slot_ms"),
        "lone_rpc_ms": more.get("lone_rpc_ms"),
        "firestore_rpcs_per_msg": None,
        "firestore_writes_per_msg": None,
        "rss_per_1000_mb": None,
    }


def _report(firestore_ratio: float, memory_ratio: float, own_ms: float) -> dict[str, Any]:
    summary = {
        "stock-eod": _row("stock-eod", 0.3, lone_slot_ms=2.0),
        "stock-eod-default": _row("stock-eod-default", 0.3),
        "wrapped-1": _row(
            "stock-eod",
            0.3 * firestore_ratio,
            firestore_ratio,
            lone_slot_ms=2.0 + 2.6 + own_ms,
            lone_rpc_ms=2.6,
        ),
        "wrapped-1-default": _row("stock-eod-default", 0.6, 2.0),
        "wrapped-1-memory": _row("stock-eod", 0.3 * memory_ratio, memory_ratio),
        "wrapped-1-memory-default": _row("stock-eod-default", 0.33, 1.1),
    }
    return {"summary": summary, "runs": []}


def _met(report: dict[str, Any], starts: str) -> bool | None:
    (target,) = [t for t in evaluate(report) if t["target"].startswith(starts)]
    met: bool | None = target["met"]
    return met


def test_cpu_on_firestore_is_judged_at_3x_and_on_memory_at_1_3x() -> None:
    assert _met(_report(2.9, 1.2, 0.5), "Consumer CPU per message on Firestore") is True
    assert _met(_report(3.1, 1.2, 0.5), "Consumer CPU per message on Firestore") is False
    assert _met(_report(2.9, 1.2, 0.5), "Consumer CPU per message on the in-memory") is True
    assert _met(_report(2.9, 1.4, 0.5), "Consumer CPU per message on the in-memory") is False


def test_a_lone_message_s_own_time_is_judged_on_one_step() -> None:
    assert _met(_report(2.0, 1.0, 0.9), "A lone message's added latency") is True
    assert _met(_report(2.0, 1.0, 1.1), "A lone message's added latency") is False


def test_the_best_flow_control_floor_is_the_issue_s() -> None:
    assert BEST_FLOOR == 0.6
    (best,) = [t for t in evaluate(_report(2.0, 1.0, 0.5)) if "best flow control" in t["target"]]
    assert ">= 60% of the stock client's best" in best["target"]


def test_an_unmet_targets_why_names_the_page_that_explains_it() -> None:
    """The report is also written to docs/benchmarks-latency.md: a bare #anchor would break."""
    generic = {"target": "t", "measured": "m", "met": False, "why": "rpcs", "stands": "s"}
    paged = {**generic, "why": "latency", "page": "elsewhere.md"}
    lines = _targets_table({"targets": [generic, paged, {**generic, "met": True}]})
    assert "**no** ([why](benchmarks.md#why-rpcs))" in lines[2]
    assert "**no** ([why](elsewhere.md#why-latency))" in lines[3]
    assert "| yes |" in lines[4]


def _memory(held: int, per_1000: float, grown: float) -> dict[str, Any]:
    stock = _row("stock-eod-default", 0.3)
    stock.update(leased_peak=850, rss_per_1000_mb=5.5, rss_growth_mb=4.7, in_flight_limit=1000)
    wrapped = _row("stock-eod-default", 0.4, 1.3)
    wrapped.update(
        leased_peak=held,
        rss_per_1000_mb=per_1000,
        rss_growth_mb=grown,
        in_flight_limit=1000,
        peak_rss_mb=88.0,
    )
    return {"summary": {"stock-eod-default": stock, "wrapped-1-default": wrapped}, "runs": []}


def test_memory_per_message_held_is_judged_against_twice_the_stock_client_s() -> None:
    memory = "Memory bounded by flow control"
    assert _met(_memory(held=600, per_1000=10.0, grown=6.0), memory) is True
    assert _met(_memory(held=600, per_1000=12.0, grown=7.2), memory) is False


def test_holding_few_messages_the_wrapper_s_whole_growth_is_judged() -> None:
    """191 held, 2.2 MB grown: 11 MB per 1,000 held is the run's fixed growth divided by few."""
    memory = "Memory bounded by flow control"
    assert _met(_memory(held=191, per_1000=11.5, grown=2.2), memory) is True
    assert _met(_memory(held=191, per_1000=30.0, grown=5.7), memory) is False
    assert _met(_memory(held=1200, per_1000=1.0, grown=1.2), memory) is False  # over the limit


def _throughput_run(name: str, repeat: int, msgs_per_s: float) -> dict[str, Any]:
    return {
        "scenario": name,
        "repeat": repeat,
        "ok": True,
        "phases": {"backlog": {"msgs_per_s": msgs_per_s}},
    }


def test_the_best_flow_control_is_judged_on_the_repeats_that_ran_every_setting() -> None:
    """The extra repeats of the CPU targets' scenarios (``--cpu-repeats``) run two of the
    stock client's settings and two of the wrapper's: a best among them is no best."""
    runs = [
        _throughput_run(name, repeat, rate)
        for repeat in (1, 2)
        for name, rate in (
            ("stock-eod", 800.0),
            ("stock-eod-c100", 1000.0),
            ("wrapped-1", 700.0),
            ("wrapped-1-c100", 550.0),
        )
    ]
    # Repeats 3-6: only wrapped-1 and its baseline, the stock client's best setting absent.
    runs += [_throughput_run("stock-eod", r, 800.0) for r in range(3, 7)]
    runs += [_throughput_run("wrapped-1", r, 700.0) for r in range(3, 7)]
    report = {"summary": {}, "runs": runs}
    (target,) = [t for t in evaluate(report) if t["why"] == "best"]
    assert target["measured"].startswith("70%")  # 700 / 1,000, not 700 / 800
    assert target["met"] is True


def test_the_report_says_which_scenarios_ran_more_repeats_and_how_many() -> None:
    runs = [_throughput_run(n, r, 1.0) for r in (1, 2) for n in ("stock-eod", "wrapped-3")]
    report = {"options": {"repeats": 2}, "runs": runs}
    assert _cpu_repeats(report) == ""
    report["runs"] = runs + [_throughput_run(n, 3, 1.0) for n in ("wrapped-1", "stock-eod")]
    assert _cpu_repeats(report) == (
        ", then those the CPU targets compare (`stock-eod`, `wrapped-1`) again, 3 repeats in all"
    )
