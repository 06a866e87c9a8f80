"""The summary of a chaos run: Markdown tables for the terminal and the docs, and JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.chaos.compare import LABELS, render_comparison
from benchmarks.chaos.verify import SHOWN_JOBS

__all__ = ["progress_line", "render", "write_json"]


def progress_line(
    now: float,
    *,
    jobs: int,
    terminal: tuple[int, int],
    acked: int,
    redelivered: int,
    faults: Mapping[str, int],
    up: int,
    workers: int,
) -> str:
    """One line of progress: jobs done, acked, redelivered; faults so far; workers running."""
    completed, failed = terminal
    partitions = faults.get("partition-pubsub", 0) + faults.get("partition-firestore", 0)
    return (
        f"[{now:5.0f}s] done {completed + failed}/{jobs} (failed {failed})  acked {acked}  "
        f"redelivered {redelivered}  |  kill {faults.get('kill', 0)} "
        f"pause {faults.get('pause', 0)} "
        f"cut {faults.get('cut-pubsub', 0) + faults.get('cut-firestore', 0)} "
        f"partition {partitions} isolate {faults.get('isolate', 0)} "
        f"ack/modack-err {faults.get('ack-errors', 0) + faults.get('modack-errors', 0)} "
        f"slow {faults.get('slow-firestore', 0)}  |  up {up}/{workers}"
    )


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def _describe(check: dict[str, Any]) -> str:
    jobs: list[str] = check["jobs"]
    if not jobs:
        return str(check["detail"])
    shown = ", ".join(jobs[:SHOWN_JOBS])
    more = f" and {len(jobs) - SHOWN_JOBS} more" if len(jobs) > SHOWN_JOBS else ""
    return f"{check['detail']}; breaking it: {shown}{more}"


def render(report: dict[str, Any]) -> str:
    """The summary of one run, in Markdown; with its baseline runs and the table comparing them."""
    text = _render_run(report)
    baseline = report.get("baseline") or []
    for run in baseline:
        text += "\n" + _render_baseline(run)
    if baseline:
        text += "\n" + render_comparison([report, *baseline])
    return text


def _render_baseline(report: dict[str, Any]) -> str:
    """A baseline run: what it ran, and the invariants it was held to (a measurement)."""
    options, phases = report["options"], report["phases"]
    label = LABELS.get(report["handler"], report["handler"])
    kills = report["figures"]["recoveries"]
    unfinished = len({job for kill in kills for job in kill["unfinished"]})
    lines = [
        f"#### Baseline, {label}, seed {report['seed']}",
        "",
        f"The stock client on the same subscription settings, {options['workers']} workers x "
        f"{options['jobs']} jobs, the same jobs and fault schedule; a create-only Firestore "
        f"document per message id, {label}. {report['markers']} markers. Faults from "
        f"{_seconds(phases['faults_from_s'])} to {_seconds(phases['faults_over_s'])}, drained "
        f"at {_seconds(phases['drained_s'])}. Kills: {len(kills)}; jobs a killed worker had "
        f"begun and nobody finished: {unfinished}.",
        "",
        "| invariant | result | counted |",
        "| --- | --- | --- |",
    ]
    for check in report["checks"]:
        result = "ok" if check["ok"] else "**broken**"
        lines.append(f"| {check['name']} | {result} | {_describe(check)} |")
    return "\n".join(lines) + "\n"


def _render_run(report: dict[str, Any]) -> str:
    options, figures, events = report["options"], report["figures"], report["events"]
    phases = report["phases"]
    verdict = "PASS" if report["ok"] else "FAIL"
    lines = [
        f"### Chaos run, seed {report['seed']}: {verdict}",
        "",
        f"`{report['command']}`",
        "",
        f"{options['workers']} workers x {options['jobs']} jobs, lease {options['lease_s']} s, "
        f"{options['max_messages']} jobs in flight per worker, store `{options['store']}`"
        f"{', **fence switched off**' if options['unfenced'] else ''}. "
        f"Subscription: exactly-once, ack deadline {report['subscription']['ack_deadline_s']} s, "
        f"{report['subscription']['why']}. "
        f"Faults from {_seconds(phases['faults_from_s'])} to {_seconds(phases['faults_over_s'])}, "
        f"drained at {_seconds(phases['drained_s'])}, stopped at {_seconds(phases['stopped_s'])}.",
        "",
        "| invariant | result | counted |",
        "| --- | --- | --- |",
    ]
    for check in report["checks"]:
        result = "ok" if check["ok"] else "**FAILED**"
        lines.append(f"| {check['name']} | {result} | {_describe(check)} |")
    pubsub = events["pubsub"]
    injected = events["errors_injected"]
    recoveries = figures["recoveries"]
    held = sum(1 for r in recoveries if r["jobs_held"])
    lines += [
        "",
        "| fault or event | count |",
        "| --- | --- |",
        f"| SIGKILL of a worker (and a restart) | {events['kill']} |",
        f"| SIGSTOP past the lease, then SIGCONT | {events['pause']} |",
        f"| connections cut: Pub/Sub, Firestore | {events['cut-pubsub']}, "
        f"{events['cut-firestore']} |",
        f"| partitions (blackhole): Pub/Sub, Firestore, both (isolated) | "
        f"{events['partition-pubsub']}, {events['partition-firestore']}, {events['isolate']} |",
        f"| transient ack errors: windows, errors injected | {events['ack-errors']}, "
        f"{injected.get('Acknowledge', 0)} |",
        f"| transient modack errors: windows, errors injected | {events['modack-errors']}, "
        f"{injected.get('ModifyAckDeadline', 0)} |",
        f"| slow Firestore windows | {events['slow-firestore']} |",
        f"| lost-ownership events | {events['lost_ownership']} |",
        f"| stale commits rejected | {events['stale_commits_rejected']} |",
        f"| redeliveries by Pub/Sub (messages redelivered); deliveries run by the wrapper "
        f"beyond one per job | {events['redeliveries']} ({events['redelivered_messages']}); "
        f"{events['wrapper_redeliveries']} |",
        f"| acks refused by Pub/Sub (job already complete) | {pubsub.get('acks_refused', 0)} |",
        f"| jobs completed / in the failure path (poison) | {figures['completed']} / "
        f"{figures['failed']} ({figures['failed_poison']}) |",
        f"| business writes | {figures['business_writes']} |",
        f"| distinct outputs; republished copies a keyed consumer drops | "
        f"{figures['distinct_outputs']}; {figures['copies_dropped']} |",
        f"| plain-step side effects (at least once); jobs where it repeated | "
        f"{figures['plain_effects']}; {figures['plain_effects_repeated_jobs']} |",
        f"| recovery after a kill: median, max ({held} of {len(recoveries)} kills held jobs) | "
        f"{_seconds(figures['recovery_median_s'])}, {_seconds(figures['recovery_max_s'])} |",
        f"| worker processes started (of which exited by themselves) | "
        f"{events['worker_incarnations']} ({phases['unexpected_exits']}) |",
        "",
    ]
    if not report["ok"]:
        lines += [
            f"**An invariant failed.** Reproduce with the same seed: `{report['command']}`",
            "",
        ]
    return "\n".join(lines)


def write_json(path: Path, reports: Sequence[dict[str, Any]]) -> None:
    """Write every run's report (one seed each) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"ok": all(r["ok"] for r in reports), "runs": list(reports)}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
