"""A phase's figures from its finished messages: latency split at the callback's start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from benchmarks.measure import phase_stats


@dataclass
class _Member:
    index: int = 0
    marks: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            mark: {"cpu_s": 0.0, "leased_peak": 0, "firestore": {}, "pubsub": {}}
            for mark in ("start", "backlog")
        }
    )


def test_the_latency_splits_into_reaching_the_callback_and_the_callback_to_the_ack() -> None:
    # [id, start, end, done, publish_wall, done_wall, process]: monotonic start/end/done,
    # wall clock at publish and at the ack's answer.
    records = [
        ["a", 10.000, 10.030, 10.050, 99.900, 100.000, 0],  # 50 ms to reach, 50 ms after
        ["b", 20.000, 20.010, 20.020, 199.930, 200.000, 0],  # 50 ms to reach, 20 ms after
        ["c", 30.000, 30.005, 30.030, 299.900, 300.000, 0],  # 70 ms to reach, 30 ms after
    ]
    stats = phase_stats(records, [_Member()], "start", "backlog", slots=1)
    assert stats["latency_ms"]["p50"] == pytest.approx(100.0)
    assert stats["slot_ms"]["p50"] == pytest.approx(30.0)
    assert sorted(stats["reach_ms"][q] for q in ("p50", "max")) == pytest.approx([50.0, 70.0])
    assert stats["reach_ms"]["mean"] == pytest.approx((50 + 50 + 70) / 3)
    # After the callback's return: 20, 10 and 25 ms waiting for the ack's answer.
    assert stats["after_ms"]["p50"] == pytest.approx(20.0)
    assert stats["after_ms"]["max"] == pytest.approx(25.0)
