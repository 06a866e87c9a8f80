"""A benchmark session settles the emulators first, on the emulators, a tiny backlog.

Fresh, the emulators' JIT makes a write cost several times the CPU it costs later;
discarded runs of ``wrapped-1`` come first until that cost holds still. No figure is
judged for speed: what is asserted is that the settling runs happened, were measured,
and were left out of every figure.
"""

from __future__ import annotations

import pytest

from benchmarks.run import parse_args, session_report
from emulator import Emulators

pytestmark = pytest.mark.timeout(600)

TINY = (
    *("--messages", "12", "--paced", "0", "--lone", "0", "--warmup", "0", "--repeats", "1"),
    *("--profiles", "-", "--markdown", "-", "--json", "-", "--plot", "-"),
)


def test_discarded_runs_settle_the_emulators_before_a_session_that_uses_firestore(
    emulators: Emulators,
) -> None:
    options = parse_args(["--scenarios", "stock-eod,wrapped-1", "--settle", "3", *TINY])
    report = session_report(options, emulators)
    costs = report["settling"]
    assert len(costs) == 3  # fewer cannot settle: three runs in a row must agree
    assert all(cost > 0 for cost in costs)  # the Firestore emulator's CPU, measured
    assert [r["label"] for r in report["runs"]] == ["r1-stock-eod", "r1-wrapped-1"]
    assert report["warmups"] == []


def test_a_session_of_the_stock_client_alone_settles_nothing(emulators: Emulators) -> None:
    options = parse_args(["--scenarios", "stock-eod", "--settle", "3", *TINY])
    report = session_report(options, emulators)
    assert report["settling"] == []
    assert [r["label"] for r in report["runs"]] == ["r1-stock-eod"]
