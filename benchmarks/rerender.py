"""Render a finished run's report again, its profile round re-read from the published profiles.

``python -m benchmarks.rerender`` reads the raw results of the last run
(``.nox/bench.json``), derives each profiled scenario's breakdown again from
the profiles that run published (``docs/profiles/``), and rewrites the
generated section of ``docs/benchmarks.md``. Use it after a change to how
the report reads its figures (:mod:`benchmarks.breakdown`,
:mod:`benchmarks.targets`, :mod:`benchmarks.report`): the figures stay the
run's own, measured once; the report says it was rendered again. It measures
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.breakdown import breakdown
from benchmarks.report import render_markdown, summarize, write_markdown
from benchmarks.run import settled

__all__ = ["main", "rerender"]

ROOT = Path(__file__).resolve().parent.parent


def rerender(report: dict[str, Any], profiles: Path) -> dict[str, Any]:
    """``report`` with its summary derived again from its runs, each profiled run's breakdown
    from ``profiles``, and whether its settling runs settled the emulators judged again."""
    report["settled"] = settled(report.get("settling") or [])
    options = report["options"]
    report["summary"] = summarize(report["runs"], options["scenarios"], options["concurrency"])
    for name, run in report.get("profiled", {}).items():
        messages = run["phases"]["backlog"]["messages"] if run.get("ok") else 0
        run["breakdown"] = breakdown(profiles, name, messages)
    report["rerendered"] = (
        "this report rendered again from the same figures by `python -m benchmarks.rerender`"
        + (" (profile parts read again from `docs/profiles/`)" if report.get("profiled") else "")
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rerender", description=__doc__)
    parser.add_argument("--json", type=Path, default=ROOT / ".nox" / "bench.json")
    parser.add_argument("--profiles", type=Path, default=ROOT / "docs" / "profiles")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    report = rerender(json.loads(args.json.read_text()), args.profiles)
    write_markdown(args.markdown, render_markdown(report))
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.markdown} and {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
