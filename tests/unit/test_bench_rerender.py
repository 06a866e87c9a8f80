"""``python -m benchmarks.rerender``: a finished run's report derived again from its own figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import rerender


def test_the_summary_is_derived_again_from_the_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A change to how the report reads its figures reaches every row, not only the tables."""
    seen: list[tuple[Any, ...]] = []

    def summarize(runs: Any, scenarios: Any, concurrency: int) -> dict[str, Any]:
        seen.append((runs, scenarios, concurrency))
        return {"wrapped-1": {"derived": "again"}}

    monkeypatch.setattr(rerender, "summarize", summarize)
    runs = [{"scenario": "wrapped-1"}]
    report: dict[str, Any] = {
        "runs": runs,
        "options": {"scenarios": ["wrapped-1"], "concurrency": 10},
        "summary": {"wrapped-1": {"derived": "by the run"}},
        "settling": [1.0, 1.0, 1.0],
    }
    out = rerender.rerender(report, tmp_path)
    assert seen == [(runs, ["wrapped-1"], 10)]
    assert out["summary"] == {"wrapped-1": {"derived": "again"}}
    assert out["settled"] is True
    assert "rendered again" in out["rerendered"]
