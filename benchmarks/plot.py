"""The PNG of a session: throughput vs steps, vs processes and vs flow control.

Needs matplotlib (the ``bench`` dependency group: ``pip install matplotlib``);
without it the report is written without the plot.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot"]

_STOCK, _WRAPPED = "#777777", "#1f6fb4"


def _series(summary: dict[str, Any], names: Sequence[str]) -> tuple[list[float], list[list[float]]]:
    """Medians and (below, above) error bars of ``names``; NaN where a scenario is missing."""
    medians, below, above = [], [], []
    for name in names:
        spread = summary.get(name, {}).get("msgs_per_s", {})
        med = spread.get("median")
        if med is None:
            medians.append(float("nan"))
            below.append(0.0)
            above.append(0.0)
            continue
        medians.append(med)
        below.append(med - (spread.get("min") or med))
        above.append((spread.get("max") or med) - med)
    return medians, [below, above]


def plot(report: dict[str, Any], path: Path) -> bool:
    """Draw the three panels into ``path``; False (and a note) if matplotlib is missing."""
    try:
        # Imported by name: an optional dependency, without type information.
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")  # files only, no display
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return False
    summary: dict[str, Any] = report["summary"]
    figure, axes = plt.subplots(1, 3, figsize=(11, 3.4), dpi=80, sharey=True)
    steps_ax, procs_ax, flow_ax = axes

    steps = ["wrapped-0", "wrapped-1", "wrapped-3"]
    medians, errors = _series(summary, steps)
    steps_ax.errorbar(
        [0, 1, 3], medians, yerr=errors, marker="o", color=_WRAPPED, capsize=3, label="exactly_once"
    )
    stock = summary.get("stock-eod", {}).get("msgs_per_s", {}).get("median")
    if stock:
        steps_ax.axhline(stock, color=_STOCK, linestyle="--", label="stock EOD")
    steps_ax.set(title="vs steps (10 in flight)", xlabel="steps", ylabel="msg/s", xticks=[0, 1, 3])

    for names, color, label in (
        (["stock-eod", "stock-eod-p2", "stock-eod-p4"], _STOCK, "stock EOD"),
        (["wrapped-1", "wrapped-1-p2", "wrapped-1-p4"], _WRAPPED, "exactly_once, 1 step"),
    ):
        medians, errors = _series(summary, names)
        procs_ax.errorbar(
            [1, 2, 4], medians, yerr=errors, marker="o", color=color, capsize=3, label=label
        )
    procs_ax.set(
        title="vs processes (10 in flight each)",
        xlabel="processes, one subscription",
        xticks=[1, 2, 4],
    )

    ticks = ["10", "30", "100", "defaults\n(1,000 / 10 thr.)"]
    for names, color, label in (
        (
            ["stock-eod", "stock-eod-c30", "stock-eod-c100", "stock-eod-default"],
            _STOCK,
            "stock EOD",
        ),
        (
            ["wrapped-1", "wrapped-1-c30", "wrapped-1-c100", "wrapped-1-default"],
            _WRAPPED,
            "exactly_once, 1 step",
        ),
    ):
        medians, errors = _series(summary, names)
        flow_ax.errorbar(
            range(4), medians, yerr=errors, marker="o", color=color, capsize=3, label=label
        )
    flow_ax.set(
        title="vs flow control (1 process)",
        xlabel="messages in flight",
        xticks=range(4),
        xticklabels=ticks,
    )

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    # Upper left is empty in every panel: the series start low and the axes are shared.
    steps_ax.legend(loc="upper left", fontsize=8)
    procs_ax.legend(loc="upper left", fontsize=8)
    figure.suptitle(
        f"pubsub-worker vs the stock client, local emulators, {report['date'][:10]}", fontsize=10
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return True
