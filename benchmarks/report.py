"""Summaries (medians over repeats, ratios within a repeat) and the Markdown report."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "render_markdown", "summarize", "write_markdown"]

BEGIN = "<!-- benchmarks:begin (written by `python -m benchmarks.run`; edits inside are lost) -->"
END = "<!-- benchmarks:end -->"

_TITLE = """# Benchmarks: the wrapper vs the stock client

`python -m benchmarks.run` (or `nox -s bench`) starts the real emulators and
runs every scenario in one session, interleaved, so each ratio compares runs
made under the same machine load. Between the markers below is the latest
output; it is rewritten on every run.

"""


def _column(rows: Sequence[dict[str, Any]], key: str, sub: str | None = None) -> list[float]:
    """``row[key]`` (or ``row[key][sub]``) of each row, skipping missing values."""
    values = (row[key] if sub is None else row[key][sub] for row in rows)
    return [float(v) for v in values if v is not None]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "median": _median(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def summarize(
    runs: Sequence[dict[str, Any]], scenarios: Sequence[str], baseline: str
) -> dict[str, dict[str, Any]]:
    """Per scenario: medians (and ranges) over its repeats; ratios against ``baseline``."""
    base = {r["repeat"]: r["msgs_per_s"] for r in runs if r["scenario"] == baseline and r["ok"]}
    out: dict[str, dict[str, Any]] = {}
    for name in scenarios:
        mine = [r for r in runs if r["scenario"] == name]
        good = [r for r in mine if r["ok"]]
        ratios = [r["msgs_per_s"] / base[r["repeat"]] for r in good if base.get(r["repeat"])]
        out[name] = {
            "runs": len(mine),
            "failed": len(mine) - len(good),
            "msgs_per_s": _spread(_column(good, "msgs_per_s")),
            "ratio_vs_baseline": _spread(ratios),
            "firestore_rpcs_per_msg": _median(_column(good, "firestore_rpcs_per_msg")),
            "firestore_writes_per_msg": _median(_column(good, "firestore_writes_per_msg")),
            "pubsub_rpcs_per_msg": _median(_column(good, "pubsub_rpcs_per_msg")),
            "latency_p50_ms": _median(_column(good, "latency_ms", "p50")),
            "latency_p99_ms": _median(_column(good, "latency_ms", "p99")),
            "service_mean_ms": _median(_column(good, "service_ms", "mean")),
            "occupancy": _median(_column(good, "occupancy")),
            "peak_rss_mb": _median(_column(good, "peak_rss_mb")),
            "cpu_ms_per_msg": {
                part: _median(_column(good, "cpu_ms_per_msg", part))
                for part in ("consumer", "firestore_emulator", "pubsub_emulator")
            },
            "machine_busy": _median(_column(good, "machine_busy")),
            "other_load_cores": _median(_column(good, "other_load_cores")),
            "redeliveries": sum(int(r["repeats_seen"]) for r in mine),
        }
    return out


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _dash(value: float | None, digits: int) -> str:
    """Like :func:`_num`, with ``-`` for zero (a stock client makes no Firestore call)."""
    return "-" if not value else _num(value, digits)


def _range(spread: dict[str, float | None], digits: int = 0, pct: bool = False) -> str:
    scale = 100.0 if pct else 1.0
    med, low, high = spread["median"], spread["min"], spread["max"]
    if med is None or low is None or high is None:
        return "n/a"
    unit = "%" if pct else ""
    text = f"{med * scale:,.{digits}f}{unit}"
    if high > low:
        text += f" ({low * scale:,.{digits}f}-{high * scale:,.{digits}f})"
    return text


def render_markdown(report: dict[str, Any]) -> str:
    """The generated section: settings, the main table and the CPU breakdown."""
    options = report["options"]
    machine = report["machine"]
    versions = report["versions"]
    summary: dict[str, dict[str, Any]] = report["summary"]
    labels: dict[str, str] = report["scenarios"]
    emulators = ", ".join(
        f"{name} {versions[name]}"
        for name in ("Pub/Sub emulator", "Firestore emulator", "Google Cloud CLI")
        if name in versions
    )
    clients = ", ".join(
        f"{name} {versions[name]}"
        for name in ("google-cloud-pubsub", "google-cloud-firestore", "grpcio")
        if name in versions
    )
    lines = [
        BEGIN,
        "",
        f"- Command: `{report['command']}` ({report['duration_s']:.0f} s)",
        f"- Date: {report['date']}",
        f"- Machine: {machine['cpus']} cores ({machine['cpu_model']}), shared with other "
        f"work; Python {machine['python']}, {machine['platform']}",
        f"- Emulators: {emulators}",
        f"- Clients: {clients}",
        f"- Per run: a fresh subscription; {options['messages']} messages published first "
        f"(throughput: first callback to last ack), then {options['paced']} published at "
        f"{options['rate']:g}/s (latency: publish time to ack done); "
        f"{options['concurrency']} callback threads and flow control "
        f"`max_messages={options['concurrency']}` in every scenario; each consumer in its own "
        f"process. {options['repeats']} repeat(s), interleaved, order rotated; medians, "
        "(min-max) over repeats; the ratio is taken within each repeat.",
        "",
        "| scenario | msg/s | vs stock EOD | Firestore RPCs/msg | p50 latency ms "
        "| p99 latency ms | peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        failed = f" ({row['failed']} failed)" if row["failed"] else ""
        lines.append(
            f"| {labels[name]}{failed} | {_range(row['msgs_per_s'])} "
            f"| {_range(row['ratio_vs_baseline'], pct=True)} "
            f"| {_dash(row['firestore_rpcs_per_msg'], 2)} "
            f"| {_num(row['latency_p50_ms'], 1)} | {_num(row['latency_p99_ms'], 1)} "
            f"| {_num(row['peak_rss_mb'])} |"
        )
    lines += [
        "",
        "Where the time goes, throughput phase (medians). Callback: wall time of one "
        "callback, which bounds throughput at concurrency / callback time. CPU: ms of CPU "
        "per message, by process (2 cores offer 2 CPU-ms per wall ms). Others: cores used "
        "by processes outside the benchmark meanwhile (noise).",
        "",
        "| scenario | callback ms (mean) | consumer CPU | Firestore emulator CPU "
        "| Pub/Sub emulator CPU | Firestore writes/msg | writes per RPC | others (cores) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        cpu = row["cpu_ms_per_msg"]
        writes, rpcs = row["firestore_writes_per_msg"], row["firestore_rpcs_per_msg"]
        per_rpc = writes / rpcs if writes and rpcs else None
        lines.append(
            f"| {labels[name]} | {_num(row['service_mean_ms'], 1)} "
            f"| {_num(cpu['consumer'], 2)} | {_num(cpu['firestore_emulator'], 2)} "
            f"| {_num(cpu['pubsub_emulator'], 2)} | {_dash(writes, 2)} "
            f"| {_num(per_rpc, 1) if per_rpc else '-'} | {_num(row['other_load_cores'], 2)} |"
        )
    redelivered = sum(row["redeliveries"] for row in summary.values())
    if redelivered:
        lines += ["", f"Redeliveries seen (not counted twice): {redelivered}."]
    lines += ["", END, ""]
    return "\n".join(lines)


def write_markdown(path: Path, generated: str) -> None:
    """Replace the generated section of ``path``, keeping the prose around it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        current = path.read_text()
    except FileNotFoundError:
        current = ""
    start, end = current.find(BEGIN), current.find(END)
    if start != -1 and end > start:
        text = current[:start] + generated.rstrip("\n") + current[end + len(END) :]
    else:
        text = (current or _TITLE) + generated
    path.write_text(text if text.endswith("\n") else text + "\n")
