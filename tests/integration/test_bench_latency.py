"""``python -m benchmarks.run --scenarios latency`` end to end, a tiny backlog, on the emulators.

A smoke test: every run of the group finishes, its consumers went through the delay proxies,
and the report carries the group's section and targets. No figure is judged for speed: the
only times asserted are floors the proxies' delays impose.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.latency import latency_section
from benchmarks.report import render_markdown
from benchmarks.run import parse_args, session_report
from benchmarks.scenarios import GROUPS, SCENARIOS
from benchmarks.targets import evaluate
from emulator import Emulators

pytestmark = pytest.mark.timeout(900)  # the session runs in the first test's setup

FIRESTORE_RTT_MS = 30.0
PUBSUB_RTT_MS = 40.0


@pytest.fixture(scope="module")
def report(emulators: Emulators) -> dict[str, Any]:
    options = parse_args(
        [
            *("--scenarios", "latency", "--messages", "12", "--paced", "6", "--rate", "20"),
            *("--lone", "2", "--warmup", "0", "--settle", "0", "--repeats", "1"),
            *("--profiles", "-"),
            *("--firestore-rtt-ms", str(FIRESTORE_RTT_MS), "--pubsub-rtt-ms", str(PUBSUB_RTT_MS)),
            *("--markdown", "-", "--json", "-", "--plot", "-"),
        ]
    )
    return session_report(options, emulators)


def test_every_run_of_the_group_finishes_its_phases(report: dict[str, Any]) -> None:
    assert set(GROUPS["latency"]) <= set(report["scenarios"])
    assert {r["scenario"] for r in report["runs"]} == set(report["scenarios"])
    failed = [(r["label"], r["stalled"] or r["error"]) for r in report["runs"] if not r["ok"]]
    assert failed == []
    for run in report["runs"]:
        phases = run["phases"]
        assert phases["backlog"]["messages"] == 12, run["label"]
        if SCENARIOS[run["scenario"]].delayed:
            assert phases["paced"]["messages"] == 6, run["label"]
            assert phases["lone"]["messages"] == 2, run["label"]


def test_the_delayed_consumers_pay_the_proxies_round_trips(report: dict[str, Any]) -> None:
    for run in report["runs"]:
        scenario = SCENARIOS[run["scenario"]]
        if not scenario.delayed:
            continue
        lone = run["phases"]["lone"]
        # A message reaches the consumer half a Pub/Sub round trip after the emulator sent it;
        # its receipt ModifyAckDeadline and its Acknowledge are a round trip each.
        assert lone["latency_ms"]["p50"] >= 2.5 * PUBSUB_RTT_MS, run["label"]
        if not scenario.stock:
            # Each Firestore RPC of a lone message (its claim, its completion) waited at least
            # one round trip for its answer.
            rpcs = lone["firestore_rpcs_per_msg"]
            assert rpcs >= 2, run["label"]
            assert lone["firestore_rpc_ms_per_msg"] >= rpcs * FIRESTORE_RTT_MS, run["label"]


def test_what_firestore_bills_each_job_is_counted(report: dict[str, Any]) -> None:
    """The batching store sends each ``BatchWrite`` serialized: its writes are counted from
    the request's bytes, so a job of N steps shows its N + 1 writes, no read, no delete."""
    for run in report["runs"]:
        scenario = SCENARIOS[run["scenario"]]
        if scenario.stock:
            continue
        backlog = run["phases"]["backlog"]
        assert backlog["billed_writes_per_msg"] == scenario.steps + 1, run["label"]
        assert backlog["billed_reads_per_msg"] == 0, run["label"]
        assert backlog["billed_deletes_per_msg"] == 0, run["label"]
    (billed,) = [t for t in evaluate(report) if t["target"].startswith("Firestore operations")]
    assert billed["met"] is True, billed


def test_the_report_shows_the_group_side_by_side_with_its_targets(report: dict[str, Any]) -> None:
    markdown = render_markdown(report)
    section = latency_section(report)
    assert "### Production round trips" in section
    assert "adding 30 ms to every Firestore round trip and 40 ms to every Pub/Sub one" in (
        "\n".join(section)
    )
    rows = [line for line in section if line.startswith("| ") and "round trips |" in line]
    assert len(rows) == len(GROUPS["latency"])
    assert "\n".join(section) in markdown
    targets = {t["target"]: t for t in report["targets"]}
    latency = [t for text, t in targets.items() if text.startswith("At production round trips")]
    assert len(latency) == 3
    for target in latency:
        assert target["met"] in (True, False), target  # measured, whichever way it went
        assert target["measured"] != "n/a"
        assert target["met"] or target.get("stands"), target
