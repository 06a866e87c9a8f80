"""Summaries (medians over repeats, ratios within a repeat) and the Markdown report."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.breakdown import profile_tables
from benchmarks.latency import PAGE, latency_section, latency_targets
from benchmarks.measure import paired
from benchmarks.scenarios import SCENARIOS
from benchmarks.targets import evaluate, lone_own_ms
from benchmarks.threads import ROLES

__all__ = ["BEGIN", "END", "render_markdown", "summarize", "write_markdown"]

BEGIN = "<!-- benchmarks:begin (written by `python -m benchmarks.run`; edits inside are lost) -->"
END = "<!-- benchmarks:end -->"

_TITLE = """# Benchmarks: the wrapper vs the stock client

`python -m benchmarks.run` (or `nox -s bench`) starts the real emulators and
runs every scenario in one session, interleaved, so each ratio compares runs
made under the same machine load. Between the markers below is the latest
output; it is rewritten on every run.

"""

Run = dict[str, Any]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "median": _median(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def _values(runs: Sequence[Run], get: Callable[[Run], float | None]) -> list[float]:
    out = []
    for run in runs:
        try:
            value = get(run)
        except (KeyError, TypeError, ZeroDivisionError):
            continue
        if value is not None:
            out.append(float(value))
    return out


def backlog(run: Run) -> dict[str, Any]:
    """The run's throughput phase."""
    phase: dict[str, Any] = run["phases"]["backlog"]
    return phase


def consumer_cpu_ms(run: Run) -> float:
    """CPU of every consumer process of the run, ms per backlog message."""
    phase = backlog(run)
    return float(sum(phase["consumer_cpu_s"]) * 1000 / phase["messages"])


def _thread_cpu_ms(role: str) -> Callable[[Run], float | None]:
    """A run's CPU of the consumers' threads of ``role``, ms per backlog message."""

    def value(run: Run) -> float | None:
        phase = backlog(run)
        spent = phase.get("consumer_cpu_by_thread_s") or {}
        return spent.get(role, 0.0) * 1000 / phase["messages"] if spent else None

    return value


def _thread_switches(role: str | None) -> Callable[[Run], float | None]:
    """A run's context switches of the consumers' threads of ``role`` (None: all), per message."""

    def value(run: Run) -> float | None:
        phase = backlog(run)
        counted = phase.get("consumer_switches_by_thread") or {}
        if not counted:
            return None
        found = sum(counted.values()) if role is None else counted.get(role, 0)
        # A thread alive at the start and gone by the end moves its earlier count out
        # of its role into "ended": that difference alone may be slightly negative.
        return max(float(found), 0.0) / float(phase["messages"])

    return value


def _rss_growth(run: Run) -> float:
    """Peak RSS growth of the run's consumers, MB: peak less the RSS once ready."""
    return float(max(p - r for p, r in zip(run["peak_rss_mb"], run["rss_ready_mb"], strict=True)))


def _rss_per_1000(run: Run) -> float | None:
    """Peak RSS growth per 1,000 messages the client held (None below 100 held: noise)."""
    held = max(backlog(run)["leased_peak"])
    if held < 100:
        return None
    return _rss_growth(run) * 1000 / float(held)


def summarize(
    runs: Sequence[Run], scenarios: Sequence[str], concurrency: int
) -> dict[str, dict[str, Any]]:
    """Per scenario: medians (and ranges) over its repeats; ratios against its baseline."""
    out: dict[str, dict[str, Any]] = {}
    for name in scenarios:
        scenario = SCENARIOS[name]
        mine = [r for r in runs if r["scenario"] == name]
        good = [r for r in mine if r["ok"]]
        base = scenario.baseline
        out[name] = {
            "runs": len(mine),
            "failed": len(mine) - len(good),
            "stalls": [r["stalled"] or r["error"] for r in mine if not r["ok"]],
            "baseline": base,
            "processes": scenario.processes,
            "in_flight_limit": scenario.in_flight(concurrency),
            "threads": scenario.threads(concurrency),
            "msgs_per_s": _spread(_values(good, lambda r: backlog(r)["msgs_per_s"])),
            "ratio_vs_baseline": _spread(
                paired(runs, name, base, lambda r: backlog(r)["msgs_per_s"])
            ),
            "firestore_rpcs_per_msg": _median(
                _values(good, lambda r: backlog(r)["firestore_rpcs_per_msg"])
            ),
            "firestore_writes_per_msg": _median(
                _values(good, lambda r: backlog(r)["firestore_writes_per_msg"])
            ),
            "pubsub_rpcs_per_msg": _median(
                _values(good, lambda r: backlog(r)["pubsub_rpcs_per_msg"])
            ),
            **{key: _median(_values(good, _backlog_value(key))) for key in _BILLED},
            "lone_firestore_rpcs_per_msg": _median(
                _values(good, lambda r: r["phases"]["lone"]["firestore_rpcs_per_msg"])
            ),
            "lone_latency_p50_ms": _median(
                _values(good, lambda r: r["phases"]["lone"]["latency_ms"]["p50"])
            ),
            "lone_callback_ms": _median(
                _values(good, lambda r: r["phases"]["lone"]["callback_ms"]["p50"])
            ),
            "lone_slot_ms": _median(_values(good, lambda r: r["phases"]["lone"]["slot_ms"]["p50"])),
            "lone_rpc_ms": _median(
                _values(good, lambda r: r["phases"]["lone"].get("firestore_rpc_ms_per_msg"))
            ),
            "latency_p50_ms": _median(
                _values(good, lambda r: r["phases"]["paced"]["latency_ms"]["p50"])
            ),
            "latency_p99_ms": _median(
                _values(good, lambda r: r["phases"]["paced"]["latency_ms"]["p99"])
            ),
            "callback_mean_ms": _median(_values(good, lambda r: backlog(r)["callback_ms"]["mean"])),
            "slot_mean_ms": _median(_values(good, lambda r: backlog(r)["slot_ms"]["mean"])),
            "occupancy": _median(_values(good, lambda r: backlog(r)["occupancy"])),
            "cpu_ms_per_msg": {
                "consumer": _median(_values(good, consumer_cpu_ms)),
                "firestore_emulator": _median(
                    _values(
                        good,
                        lambda r: (
                            backlog(r)["firestore_emulator_s"] * 1000 / backlog(r)["messages"]
                        ),
                    )
                ),
                "pubsub_emulator": _median(
                    _values(
                        good,
                        lambda r: backlog(r)["pubsub_emulator_s"] * 1000 / backlog(r)["messages"],
                    )
                ),
            },
            "cpu_ms_by_thread": {
                role: _median(_values(good, _thread_cpu_ms(role))) for role in ROLES
            },
            "switches_by_thread": {
                "all": _median(_values(good, _thread_switches(None))),
                **{role: _median(_values(good, _thread_switches(role))) for role in ROLES},
            },
            "cpu_ratio_vs_baseline": _median(paired(runs, name, base, consumer_cpu_ms)),
            "versus": scenario.versus,
            "ratio_vs_versus": _spread(
                paired(runs, name, scenario.versus, lambda r: backlog(r)["msgs_per_s"])
                if scenario.versus
                else []
            ),
            "cpu_ratio_vs_versus": _median(
                paired(runs, name, scenario.versus, consumer_cpu_ms) if scenario.versus else []
            ),
            "machine_busy": _median(_values(good, lambda r: backlog(r)["machine_busy"])),
            "other_load_cores": _median(_values(good, lambda r: backlog(r)["other_load_cores"])),
            "stolen_cores": _median(_values(good, lambda r: backlog(r).get("stolen_cores"))),
            "peak_rss_mb": _median(_values(good, lambda r: max(r["peak_rss_mb"]))),
            "leased_peak": _median(_values(good, lambda r: max(backlog(r)["leased_peak"]))),
            "rss_per_1000_mb": _median(_values(good, _rss_per_1000)),
            "rss_growth_mb": _median(_values(good, _rss_growth)),
            "process_share": _median(
                _values(
                    good,
                    lambda r: (
                        min(backlog(r)["per_process_msgs"]) / max(backlog(r)["per_process_msgs"])
                    ),
                )
            ),
            "redeliveries": sum(int(r.get("redeliveries", 0)) for r in mine),
            "client_warnings": _warnings(mine),
            "ack_failures": sum(int(r.get("ack_failures", 0)) for r in mine),
        }
    return out


def _warnings(runs: Sequence[Run]) -> dict[str, list[int]]:
    """The stock client's warnings, by message: how many in each run that had any."""
    out: dict[str, list[int]] = {}
    for run in runs:
        for text, count in (run.get("client_warnings") or {}).items():
            out.setdefault(text, []).append(int(count))
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


def _header(report: dict[str, Any]) -> list[str]:
    options, machine, versions = report["options"], report["machine"], report["versions"]
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
    return [
        f"- Command: `{report['command']}` ({report['duration_s'] / 60:.1f} min)"
        + (f"; {report['rerendered']}" if report.get("rerendered") else ""),
        f"- Date: {report['date']}",
        f"- Machine: {machine['cpus']} cores ({machine['cpu_model']}), shared with other "
        f"work; Python {machine['python']}, {machine['platform']}",
        f"- Cores: {report.get('cores', 'every process on every core')} "
        "([why](benchmarks.md#cores))",
        f"- Emulators: {emulators}",
        f"- Clients: {clients}; pubsub_worker at {report.get('code', '?')}",
        f"- Per run: a fresh subscription; {options['messages']} messages of 256 bytes "
        + ("per consumer process " if report.get("backlog_per_process") else "")
        + "published first (throughput: first callback to last ack answered, across the "
        f"fleet), then, for the scenarios with latency figures, {options['paced']} published "
        f"at {options['rate']:g}/s (latency: publish time to ack answered) and "
        f"{options['lone']} one at a time (lone). Fixed setup: flow control "
        f"`max_messages={options['concurrency']}` and as many callback threads. Each consumer "
        f"in its own process. {_settled(report)}A warm-up run per scenario, then "
        f"{options['repeats']} repeat(s), interleaved, order rotated{_cpu_repeats(report)}; "
        "medians, (min-max) over repeats; each ratio is taken within a repeat against the "
        "stock EOD client with the same setup.",
    ]


def _cpu_repeats(report: dict[str, Any]) -> str:
    """The extra repeats of the scenarios the CPU targets compare, as a clause; "" if none."""
    repeats = report["options"]["repeats"]
    more = sorted({r["scenario"] for r in report["runs"] if r["repeat"] > repeats})
    if not more:
        return ""
    total = max(r["repeat"] for r in report["runs"])
    return (
        f", then those the CPU targets compare ({', '.join(f'`{n}`' for n in more)}) "
        f"again, {total} repeats in all"
    )


def _settled(report: dict[str, Any]) -> str:
    """How the emulators settled before the warm-ups (their JIT), as a sentence; "" if not."""
    costs: list[float] = report.get("settling") or []
    if not costs:
        return ""
    figures = ", ".join(f"{c:.2f}" for c in costs)
    if not report["settled"]:
        return (
            f"First {len(costs)} discarded run(s) of `wrapped-1` did **not** settle the "
            f"emulators (the Firestore emulator's CPU per message, run by run: {figures} ms): "
            "its cost was still moving, so the wrapped figures compare less well with other "
            "sessions'. "
        )
    return (
        f"First {len(costs)} discarded run(s) of `wrapped-1` settled the emulators (the "
        f"Firestore emulator's CPU per message, run by run: {figures} ms). "
    )


def _main_table(report: dict[str, Any]) -> list[str]:
    summary: dict[str, dict[str, Any]] = report["summary"]
    labels: dict[str, str] = report["scenarios"]
    lines = [
        "| scenario | consumer CPU ms/msg | vs stock CPU "
        "| Firestore billed per job: writes / reads / deletes | Firestore RPCs/msg "
        "| msg/s | vs stock, same setup | lone: RPCs/msg | lone: own ms "
        "| p50 / p99 latency ms | peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        failed = f" ({row['failed']} failed)" if row["failed"] else ""
        own = row["baseline"] == name
        ratio = "100%" if own else _range(row["ratio_vs_baseline"], pct=True)
        cpu_ratio = "1.0x" if own else f"{_num(row['cpu_ratio_vs_baseline'], 1)}x"
        latency = (
            f"{_num(row['latency_p50_ms'], 1)} / {_num(row['latency_p99_ms'], 1)}"
            if row["latency_p50_ms"] is not None
            else "-"
        )
        lines.append(
            f"| {labels[name]}{failed} "
            f"| {_num(row['cpu_ms_per_msg']['consumer'], 2)} | {cpu_ratio} "
            f"| {_billed(row)} | {_dash(row['firestore_rpcs_per_msg'], 2)} "
            f"| {_range(row['msgs_per_s'])} | {ratio} "
            f"| {_dash(row['lone_firestore_rpcs_per_msg'], 1)} "
            f"| {_num_or_dash(lone_own_ms(summary, name), 2)} | {latency} "
            f"| {_num(row['peak_rss_mb'])} |"
        )
    return lines


_BILLED = ("billed_writes_per_msg", "billed_reads_per_msg", "billed_deletes_per_msg")


def _backlog_value(key: str) -> Callable[[Run], float | None]:
    """A run's backlog-phase figure ``key`` (None in a run recorded before it existed)."""

    def get(run: Run) -> float | None:
        value = run["phases"]["backlog"].get(key)
        return None if value is None else float(value)

    return get


def _num_or_dash(value: float | None, digits: int) -> str:
    return "-" if value is None else _num(value, digits)


def _billed(row: dict[str, Any]) -> str:
    """Billed Firestore operations per job, ``writes / reads / deletes`` (``-``: no Firestore)."""
    counts = [row.get(key) for key in _BILLED]
    if not any(counts):
        return "-"
    return " / ".join(_num(count or 0.0, 2) for count in counts)


def _others(row: dict[str, Any]) -> str:
    """Cores taken by other work, and how many of them the hypervisor stole (when known)."""
    stolen = row.get("stolen_cores")
    others = _num(row["other_load_cores"], 2)
    return others if stolen is None else f"{others} ({_num(stolen, 2)})"


def _time_table(report: dict[str, Any]) -> list[str]:
    summary: dict[str, dict[str, Any]] = report["summary"]
    labels: dict[str, str] = report["scenarios"]
    lines = [
        "| scenario | in flight (limit) / threads | callback ms | to ack answered ms "
        "| lone: callback / to ack ms | consumer CPU | Firestore emulator CPU "
        "| Pub/Sub emulator CPU | writes per RPC "
        "| RSS MB per 1,000 held | machine busy | others (stolen), cores |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        cpu = row["cpu_ms_per_msg"]
        lone = (
            f"{_num(row['lone_callback_ms'], 1)} / {_num(row['lone_slot_ms'], 1)}"
            if row["lone_callback_ms"] is not None
            else "-"
        )
        writes, rpcs = row["firestore_writes_per_msg"], row["firestore_rpcs_per_msg"]
        per_rpc = writes / rpcs if writes and rpcs else None
        procs = f"{row['processes']} x " if row["processes"] > 1 else ""
        held = f"{procs}{_num(row['leased_peak'])} ({row['in_flight_limit']}) / {row['threads']}"
        lines.append(
            f"| {labels[name]} | {held} | {_num(row['callback_mean_ms'], 1)} "
            f"| {_num(row['slot_mean_ms'], 1)} | {lone} "
            f"| {_num(cpu['consumer'], 2)} | {_num(cpu['firestore_emulator'], 2)} "
            f"| {_num(cpu['pubsub_emulator'], 2)} | {_num(per_rpc, 1) if per_rpc else '-'} "
            f"| {_num(row['rss_per_1000_mb'], 0) if row['rss_per_1000_mb'] else '-'} "
            f"| {_num((row['machine_busy'] or 0) * 100)}% "
            f"| {_others(row)} |"
        )
    return lines


def _role_table(
    report: dict[str, Any],
    first: str,
    total: Callable[[dict[str, Any]], float | None],
    by_role: Callable[[dict[str, Any]], dict[str, float | None]],
    digits: int,
) -> list[str]:
    """A row per scenario with a reading: its ``total`` (column ``first``), then each role."""
    summary: dict[str, dict[str, Any]] = report["summary"]
    labels: dict[str, str] = report["scenarios"]
    rows = [(name, row) for name, row in summary.items() if total(row) is not None]
    if not rows:
        return []
    lines = [
        f"| scenario | {first} | " + " | ".join(ROLES) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in ROLES) + " |",
    ]
    for name, row in rows:
        cells = " | ".join(_num(by_role(row).get(role), digits) for role in ROLES)
        lines.append(f"| {labels[name]} | {_num(total(row), digits)} | {cells} |")
    return lines


def _thread_table(report: dict[str, Any]) -> list[str]:
    def total(row: dict[str, Any]) -> float | None:
        measured = any(v is not None for v in row.get("cpu_ms_by_thread", {}).values())
        return float(row["cpu_ms_per_msg"]["consumer"]) if measured else None

    return _role_table(report, "consumer CPU", total, lambda row: row["cpu_ms_by_thread"], 2)


def _switch_table(report: dict[str, Any]) -> list[str]:
    def counted(row: dict[str, Any]) -> dict[str, float | None]:
        found: dict[str, float | None] = row.get("switches_by_thread", {})
        return found

    return _role_table(report, "all threads", lambda row: counted(row).get("all"), counted, 1)


def _versus_table(report: dict[str, Any]) -> list[str]:
    """Scenarios compared with a second one (an async handler with its sync twin)."""
    summary: dict[str, dict[str, Any]] = report["summary"]
    labels: dict[str, str] = report["scenarios"]
    rows = [(name, row) for name, row in summary.items() if row.get("versus") in summary]
    if not rows:
        return []
    lines = [
        "| scenario | msg/s | compared with | its msg/s | ratio | consumer CPU ms/msg | "
        "CPU ratio | peak RSS MB |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows:
        other = summary[row["versus"]]
        lines.append(
            f"| {labels[name]} | {_range(row['msgs_per_s'])} | {labels[row['versus']]} "
            f"| {_range(other['msgs_per_s'])} | {_range(row['ratio_vs_versus'], pct=True)} "
            f"| {_num(row['cpu_ms_per_msg']['consumer'], 2)} "
            f"| {_num(row['cpu_ratio_vs_versus'], 2)}x | {_num(row['peak_rss_mb'])} |"
        )
    return lines


def _targets_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| target | measured | met | what stands in the way (this session's profiles) |",
        "| --- | --- | :---: | --- |",
    ]
    for target in report["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[target["met"]]
        stands = ""
        if target["met"] is False and target.get("why"):
            # The page that explains it, named: the report may be written to another page.
            met += f" ([why]({target.get('page', PAGE)}#why-{target['why']}))"
            stands = target.get("stands", "")
        lines.append(f"| {target['target']} | {target['measured']} | {met} | {stands} |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The generated section: settings, targets, the tables, stalls, the plot."""
    report["targets"] = [*evaluate(report), *latency_targets(report)]
    lines = [BEGIN, "", *_header(report), "", "### Targets", "", *_targets_table(report)]
    lines += ["", "### Throughput, CPU and RPCs", "", *_main_table(report)]
    if report.get("plot"):
        lines += ["", f"![throughput vs steps, processes and flow control]({report['plot']})"]
    lines += latency_section(report)
    versus = _versus_table(report)
    if versus:
        lines += [
            "",
            "### `async def` against the sync path, same flow control",
            "",
            "Each ratio is taken within a repeat against the scenario compared with: the same "
            "steps, flow control and threads, the handler and its steps `async def` "
            "(awaited on the worker's event loop) instead of sync.",
            "",
            *versus,
        ]
    profiles = profile_tables(report)
    if profiles:
        lines += ["", '<a id="profiles"></a>', "### Profiles of this session", "", *profiles]
    lines += [
        "",
        "### Where the time goes",
        "",
        "Backlog phase, medians (lone: the median lone message). In flight: the most messages "
        "the client held at once "
        "(received, not yet settled; per process), against its flow-control limit. Callback: "
        "wall time of one callback; to ack answered: from its start to the ack's answer (the "
        "wrapper sends its ack without waiting; the client keeps the flow-control slot until "
        "the answer). CPU: ms per message, by process (2 cores offer 2 CPU-ms per wall ms). "
        "Machine busy: the share of both cores in use; others: cores taken meanwhile by "
        "work outside the benchmark (noise), and in brackets the part the hypervisor stole "
        "for other machines on the host.",
        "",
        *_time_table(report),
    ]
    by_thread = _thread_table(report)
    if by_thread:
        lines += [
            "",
            '<a id="threads"></a>',
            "### Consumer CPU by thread",
            "",
            "Backlog phase, ms per message, medians (each column's median apart, so a row need "
            "not add up to its total): the CPU of the consumer's threads by what they do, read "
            "from `/proc` at the phase's start and end (`benchmarks/threads.py`). "
            + "; ".join(f"{role}: {text}" for role, text in ROLES.items())
            + ".",
            "",
            *by_thread,
        ]
    switches = _switch_table(report)
    if switches:
        lines += [
            "",
            '<a id="switches"></a>',
            "### Context switches by thread",
            "",
            "Backlog phase, per message, medians: the times the consumer's threads were "
            "switched out (blocked on a lock, a queue, an RPC or the GIL, or preempted), by the "
            "same roles. Each is a wake-up, and a hand-off between threads costs one or two: "
            "the hand-offs a design makes per message.",
            "",
            *switches,
        ]
    stalls = [
        f"- {report['scenarios'][name]}: {why}"
        for name, row in report["summary"].items()
        for why in row["stalls"]
    ] + [
        f"- warm-up {w['scenario']}: {w['stalled'] or w['error']}"
        for w in report.get("warmups", [])
        if not w["ok"]
    ]
    if stalls:
        lines += ["", "Failed or stalled runs (bounded, not waited for):", "", *stalls]
    noisy = [
        f"- {report['scenarios'][name]}: "
        + "; ".join(
            f"{text!r} in {len(counts)} of {row['runs']} runs ({', '.join(map(str, counts))})"
            for text, counts in row["client_warnings"].items()
        )
        for name, row in report["summary"].items()
        if row["client_warnings"]
    ]
    if noisy:
        lines += [
            "",
            "Warnings the stock client logged (its own logger, each with a traceback):",
            "",
            *noisy,
        ]
    redelivered = sum(row["redeliveries"] for row in report["summary"].values())
    if redelivered:
        lines += ["", f"Redeliveries seen (counted once): {redelivered}."]
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
