"""Benchmark the wrapper against the stock client: ``python -m benchmarks.run [--quick]``.

One session starts the real emulators and runs every chosen scenario (see
:mod:`benchmarks.scenarios`) ``--repeats`` times, interleaved, with the order
rotated each repeat, so that whatever else the machine does hits all of them
alike. First the emulators settle: fresh, their JIT makes a Firestore write
cost several times the CPU it costs a few thousand writes later (5.9 ms per
message on a fresh emulator, 0.8-1.1 once warm, in runs of 2026-12-03), so
discarded runs of ``wrapped-1`` come first until that figure holds within
:data:`SETTLED` over three runs in a row (``--settle``, at most :data:`SETTLE_LIMIT`);
the report says when they did not; then a
discarded warm-up run of each scenario. One run (:mod:`benchmarks.fleet`) gets a fresh
topic and subscription, publishes its backlog, starts the scenario's
consumer processes and measures the phases; a stalled run ends at its bound
and is reported, never waited for.

Ratios are computed within a repeat (scenario / its stock baseline in the
same repeat) and summarised by their median. Results go to stdout
(Markdown), to ``docs/benchmarks.md`` (between generated-section markers, so
prose around them survives), to ``docs/benchmarks.png`` and to
``.nox/bench.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.breakdown import PROFILED, breakdown
from benchmarks.cores import Layout, pin_tree
from benchmarks.fleet import Plan, Publisher, run_once
from benchmarks.latency import FIRESTORE_RTT_MS, PUBSUB_RTT_MS, DelayProxies
from benchmarks.machine import emulators, machine, versions
from benchmarks.profile import sampling
from benchmarks.report import render_markdown, summarize, write_markdown
from benchmarks.scenarios import BASELINE, DEFAULT_SCENARIOS, GROUPS, SCENARIOS, Scenario, expand
from benchmarks.targets import CPU_FIRESTORE, CPU_MEMORY

__all__ = ["Options", "main", "parse_args", "session_report"]

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "pubsub-worker-bench"
PAYLOAD_BYTES = 256
PROFILE_ROUND = -1
"""The repeat number of the profile round's runs."""
SETTLE_SCENARIO = "wrapped-1"
"""The scenario whose discarded runs settle the emulators: it drives both."""
SETTLED = 0.15
"""Settled: the Firestore emulator's CPU per message of three runs in a row within this."""
SETTLE_LIMIT = 12
"""Settling runs at most, by default. The emulator's cost mostly settles within 4-6 runs,
but in a session of 2026-12-04 it was still falling at the 8th (7.00 to 1.06 ms)."""


@dataclass(frozen=True)
class Options:
    """What a benchmark session does."""

    scenarios: tuple[str, ...]
    messages: int
    paced: int
    rate: float
    lone: int
    repeats: int
    concurrency: int
    warmup: int
    stall_s: float
    timeout_s: float
    markdown: Path | None
    json_path: Path | None
    plot: Path | None
    command: str
    py_spy: Path | None = None
    profiles: Path | None = None
    """Where the profile round's profiles go (gzipped); None: no profile round."""
    profile_messages: int = 9000
    """The backlog of each run of the profile round: at 100 samples a second, a 1,500-message
    backlog gave a one-step consumer 20-50 samples holding the GIL, too few to split."""
    firestore_rtt_ms: float = FIRESTORE_RTT_MS
    """Added to every Firestore round trip of the delayed scenarios (group ``latency``)."""
    pubsub_rtt_ms: float = PUBSUB_RTT_MS
    """Added to every Pub/Sub round trip of the delayed scenarios."""
    settle: int = 0
    """At most this many discarded runs of :data:`SETTLE_SCENARIO` first; 0: none."""
    cores: str = "split"
    """``split``: a one-process scenario's consumer on a core of its own
    (:mod:`benchmarks.cores`); ``shared``: every process on every core."""
    cpu_repeats: int = 0
    """The scenarios the CPU targets compare (:data:`~benchmarks.targets.CPU_COMPARED`)
    run this many times in all, the others :attr:`repeats` (no fewer)."""


def backlog_of(options: Options, repeat: int) -> int:
    """The backlog of a run of a session: ``repeat`` 0 is the warm-up, :data:`PROFILE_ROUND`
    the profile round's run, below it a settling run, above it a measured repeat."""
    if repeat == 0:
        return options.warmup
    if repeat == PROFILE_ROUND:
        return options.profile_messages
    return options.messages


def scenario_backlog(backlog: int, scenario: Scenario) -> int:
    """The messages a run of ``scenario`` publishes first, when a lone consumer's run has
    ``backlog``: its share of it (large payloads take fewer), for each of its processes.

    A fleet's every process gets a lone consumer's backlog: with one backlog shared, four
    processes drained it in about a second, half of it their start and their tail, in which
    fewer than four work, and the fleet's throughput was theirs more than the fleet's.
    """
    return max(int(backlog * scenario.backlog_share), 10) * scenario.processes


def run_order(names: Sequence[str], options: Options) -> list[tuple[str, int]]:
    """The measured runs of a session, in order: (scenario, repeat).

    Every scenario ``repeats`` times, each repeat in an order rotated by one; then the
    wrapper's scenarios of ``names`` that the CPU targets compare, and their stock
    baselines (:data:`~benchmarks.targets.CPU_COMPARED`), again, rotated alike, up to
    ``cpu_repeats`` in all.
    """

    def rotated(these: Sequence[str], repeats: range) -> list[tuple[str, int]]:
        runs: list[tuple[str, int]] = []
        for repeat in repeats:
            shift = (repeat - 1) % len(these)
            runs += [(name, repeat) for name in [*these[shift:], *these[:shift]]]
        return runs

    order = rotated(names, range(1, options.repeats + 1))
    wrapped = {name for name in names if name in (*CPU_FIRESTORE, *CPU_MEMORY)}
    if not wrapped:
        return order
    compared = [n for n in names if n in wrapped or n in {SCENARIOS[w].baseline for w in wrapped}]
    return order + rotated(compared, range(options.repeats + 1, options.cpu_repeats + 1))


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Read the command line; ``--quick`` changes the defaults, explicit values win."""
    groups = "; ".join(f"{g}: {', '.join(names)}" for g, names in GROUPS.items())
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Wrapper vs stock Pub/Sub client on the local emulators, in one session.",
        epilog=f"Groups: {groups}.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: short, not to quote")
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help="comma-separated scenario or group names; baselines are added "
        f"(default: %(default)s; scenarios: {', '.join(SCENARIOS)})",
    )
    parser.add_argument("--messages", type=int, help="backlog per run (default 1500; quick 300)")
    parser.add_argument("--paced", type=int, help="paced messages per run (default 200; quick 60)")
    parser.add_argument("--rate", type=float, default=100.0, help="paced msg/s (default 100)")
    parser.add_argument(
        "--lone", type=int, help="messages sent one at a time, per run (default 20; quick 10)"
    )
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 5; quick 1)")
    parser.add_argument(
        "--cpu-repeats",
        type=int,
        help="runs in all of the scenarios the CPU targets compare and their stock baselines "
        "(default 15; as --repeats when that is given, and quick): one run's ratio is a draw "
        "of the host's speed spells, and on five repeats two readings of it part by up to a "
        "quarter",
    )
    parser.add_argument(
        "--profile-messages",
        type=int,
        help="backlog of each run of the profile round (default 9000; quick 600): enough "
        "samples to split a message's CPU by part",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=10,
        help="flow control max_messages = callback threads of the fixed-setup scenarios "
        "(default 10: the stock client's default threads and PUBSUB_WORKER_MAX_MESSAGES)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help="messages of one discarded warm-up run per scenario (default 600; quick 150)",
    )
    parser.add_argument(
        "--settle",
        type=int,
        help=f"at most this many discarded runs of {SETTLE_SCENARIO} before the warm-ups, "
        f"until the Firestore emulator's CPU per message settles (its JIT; default {SETTLE_LIMIT}, "
        "quick 0; none when no chosen scenario uses Firestore)",
    )
    parser.add_argument(
        "--stall",
        type=float,
        default=30.0,
        help="a phase with no ack for this many seconds ends as stalled (default 30)",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="bound on one phase, seconds (default 180)"
    )
    parser.add_argument(
        "--markdown",
        default=str(ROOT / "docs" / "benchmarks.md"),
        help="report file (default docs/benchmarks.md); '-' for none",
    )
    parser.add_argument(
        "--json",
        default=str(ROOT / ".nox" / "bench.json"),
        help="raw results (default .nox/bench.json); '-' for none",
    )
    parser.add_argument(
        "--plot",
        default=str(ROOT / "docs" / "benchmarks.png"),
        help="PNG of throughput vs steps, processes and flow control (default "
        "docs/benchmarks.png; needs matplotlib); '-' for none",
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile each measured consumer's backlog phase with py-spy (CPU and wall "
        "profiles, raw collapsed stacks in DIR; summarise with `python -m benchmarks.profile "
        "DIR`; the sampling perturbs the numbers: a diagnostic, not a measurement)",
    )
    parser.add_argument(
        "--profiles",
        default=str(ROOT / "docs" / "profiles"),
        help="after the repeats, one more run of each profiled scenario with py-spy attached "
        "(not counted in the figures): its breakdown goes in the report, its raw profiles here, "
        "gzipped (default docs/profiles; '-' for no profile round; skipped without py-spy)",
    )
    parser.add_argument(
        "--firestore-rtt-ms",
        type=float,
        default=FIRESTORE_RTT_MS,
        metavar="MS",
        help="added to every Firestore round trip of the consumers of the delayed scenarios "
        "(group latency) by a loopback delay proxy (default %(default)g)",
    )
    parser.add_argument(
        "--pubsub-rtt-ms",
        type=float,
        default=PUBSUB_RTT_MS,
        metavar="MS",
        help="added to every Pub/Sub round trip of the consumers of the delayed scenarios "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--cores",
        choices=("split", "shared"),
        default="split",
        help="split: the consumer of a one-process scenario on the last core, the emulators "
        "and this harness on the others, as in production where Pub/Sub and Firestore run "
        "elsewhere (benchmarks/cores.py); shared: every process on every core (default "
        "%(default)s; split needs two cores)",
    )
    args = parser.parse_args(argv)
    for flag, value in (
        ("--firestore-rtt-ms", args.firestore_rtt_ms),
        ("--pubsub-rtt-ms", args.pubsub_rtt_ms),
    ):
        if not value >= 0:
            parser.error(f"{flag} must be >= 0 ms, got {value:g}")
    if args.py_spy and _py_spy_path() is None:
        parser.error("--py-spy needs py-spy (pip install py-spy)")
    try:
        names = expand([n.strip() for n in args.scenarios.split(",") if n.strip()])
    except KeyError as exc:
        parser.error(f"unknown scenario or group: {exc.args[0]}")
    quick = args.quick

    def pick(value: Any, normal: Any, fast: Any) -> Any:
        return value if value is not None else (fast if quick else normal)

    def path(value: str) -> Path | None:
        return None if value == "-" else Path(value)

    given = list(sys.argv[1:] if argv is None else argv)
    return Options(
        scenarios=names,
        messages=pick(args.messages, 1500, 300),
        paced=pick(args.paced, 200, 60),
        rate=args.rate,
        lone=pick(args.lone, 20, 10),
        repeats=pick(args.repeats, 5, 1),
        # Given --repeats, the compared scenarios run as often as the others unless told.
        cpu_repeats=pick(args.cpu_repeats, 0 if args.repeats is not None else 15, 0),
        concurrency=args.concurrency,
        warmup=pick(args.warmup, 600, 150),
        stall_s=args.stall,
        timeout_s=args.timeout,
        markdown=path(args.markdown),
        json_path=path(args.json),
        plot=path(args.plot),
        command=shlex.join(["python", "-m", "benchmarks.run", *given]),
        py_spy=Path(args.py_spy) if args.py_spy else None,
        profiles=path(args.profiles),
        profile_messages=pick(args.profile_messages, 9000, 600),
        firestore_rtt_ms=args.firestore_rtt_ms,
        pubsub_rtt_ms=args.pubsub_rtt_ms,
        settle=max(pick(args.settle, SETTLE_LIMIT, 0), 0),
        cores=args.cores,
    )


def _py_spy_path() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def settled(costs: Sequence[float]) -> bool:
    """Whether the last three runs' Firestore emulator CPU per message lie within
    :data:`SETTLED` of each other (highest over lowest).

    Two runs are not enough: a fresh emulator's cost falls in steps (11.2,
    6.9, 5.9, then 3.4 and 1.7 ms per message in one session of 2026-12-03).
    """
    last = costs[-3:]
    return len(last) == 3 and min(last) > 0 and max(last) / min(last) < 1 + SETTLED


def settle_emulators(run: Callable[[], float | None], limit: int) -> list[float]:
    """Call ``run`` (one discarded run: the Firestore emulator's CPU ms per message, or None
    when it failed) until :func:`settled`, a run fails, or ``limit`` runs; their figures."""
    costs: list[float] = []
    for _ in range(limit):
        cost = run()
        if cost is None:
            break
        costs.append(cost)
        if settled(costs):
            break
    return costs


class _Progress:
    """The progress line on stderr: where the session is and about how long it has left."""

    def __init__(self, total_runs: int) -> None:
        self._total = total_runs
        self._done = 0
        self._started = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._label = ""
        self._last_line = 0.0

    def _eta(self) -> str:
        elapsed = time.monotonic() - self._started
        if not self._done:
            return f"{elapsed:4.0f} s"
        left = elapsed / self._done * (self._total - self._done)
        return f"{elapsed:4.0f} s, ~{left / 60:.0f} min left"

    def add(self, runs: int) -> None:
        """``runs`` more runs to come (the profile round)."""
        self._total += runs

    def begin(self, label: str) -> None:
        self._label = label

    def phase(self, phase: str, acked: int, published: int, seconds: float) -> None:
        """Called while a phase runs: in place on a terminal, else every 10 s of a long phase."""
        now = time.monotonic()
        rate = acked / seconds if seconds > 0 else 0.0
        text = (
            f"[{self._done + 1}/{self._total} {self._eta()}] {self._label} {phase} "
            f"{acked}/{published} acked ({rate:.0f}/s)"
        )
        if self._tty:
            sys.stderr.write("\r" + text[:150].ljust(150))
            sys.stderr.flush()
        elif seconds >= 10 and now - self._last_line >= 10:
            self._last_line = now
            print("  " + text, file=sys.stderr, flush=True)

    def end(self, text: str) -> None:
        self._done += 1
        if self._tty:
            sys.stderr.write("\r" + " " * 150 + "\r")
        print(f"  [{self._done}/{self._total} {self._eta()}] {text}", file=sys.stderr, flush=True)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _line(name: str, run: dict[str, Any], seconds: float) -> str:
    """One finished run, for the progress log."""
    if not run["ok"]:
        return f"{name:<20} FAILED ({seconds:.1f} s): {run['stalled'] or run['error']}"
    backlog = run["phases"]["backlog"]
    text = (
        f"{name:<20} {backlog['msgs_per_s']:7.0f} msg/s  "
        f"{backlog['firestore_rpcs_per_msg']:.2f} Firestore RPC/msg  "
        f"CPU {sum(backlog['consumer_cpu_s']) * 1000 / max(backlog['messages'], 1):.2f} ms/msg  "
        f"RSS {max(run['peak_rss_mb']):4.0f} MB  others {backlog['other_load_cores']:.2f} "
        f"(stolen {backlog['stolen_cores']:.2f})"
    )
    lone = run["phases"].get("lone")
    if lone:
        text += f"  lone {lone['firestore_rpcs_per_msg']:.1f} RPC/msg"
    return f"{text}  ({seconds:.1f} s)"


class _Session:
    """The runs of one session, on one pair of emulators."""

    def __init__(self, options: Options, emu: Any, progress: _Progress) -> None:
        from emulator.bootstrap import publisher_admin, subscriber_admin  # noqa: PLC0415

        self.options = options
        self.emu = emu
        self.progress = progress
        self.logs = Path(tempfile.mkdtemp(prefix="bench-consumers-"))
        self.spy = _py_spy_path() if options.py_spy or options.profiles else None
        self.admin = (publisher_admin(emu.pubsub_host), subscriber_admin(emu.pubsub_host))
        self.publisher = Publisher(PAYLOAD_BYTES)
        self.runs: list[dict[str, Any]] = []
        self.warmups: list[dict[str, Any]] = []  # discarded, but a stall there is a stall
        self.settling: list[float] = []  # the Firestore emulator's CPU ms per message, by run
        self.profiled: dict[str, dict[str, Any]] = {}  # the profile round, not in the figures
        self.proxies: DelayProxies | None = None  # started for the first delayed scenario
        self.layout = Layout.split(os.sched_getaffinity(0)) if options.cores == "split" else None

    def place(self, name: str) -> dict[str, str]:
        """Move the emulators and this harness for scenario ``name``: off the consumer's core
        when it runs one process, on every core otherwise; the consumers' variables."""
        if self.layout is None:
            return {}
        alone = SCENARIOS[name].processes == 1
        self._move(self.layout.rest if alone else self.layout.every)
        return dict(self.layout.consumer_env()) if alone else {}

    def _move(self, cpus: frozenset[int]) -> None:
        for pid in {os.getpid(), *self.emu.pids.values()}:  # the emulators and their children
            pin_tree(pid, cpus)

    def env(self, name: str) -> dict[str, str]:
        """The consumers' environment over the emulators' own: the scenario's own, and the
        delay proxies, if delayed."""
        scenario = SCENARIOS[name]
        if not scenario.delayed:
            return scenario.env()
        if self.proxies is None:
            self.proxies = DelayProxies(
                self.emu,
                firestore_rtt_ms=self.options.firestore_rtt_ms,
                pubsub_rtt_ms=self.options.pubsub_rtt_ms,
            )
        return {**scenario.env(), **self.proxies.env()}

    def one(self, name: str, repeat: int) -> dict[str, Any]:
        """One run of ``name``; repeat 0 is its warm-up (no latency phases, no profile).

        Repeat -1 is its run in the profile round: py-spy attached, no latency phases.
        """
        options, scenario = self.options, SCENARIOS[name]
        settling = repeat < PROFILE_ROUND
        warm, profiled = repeat == 0 or settling, repeat == PROFILE_ROUND
        label = (
            f"settle{len(self.settling) + 1}-{name}"
            if settling
            else f"warmup-{name}"
            if warm
            else f"profile-{name}"
            if profiled
            else f"r{repeat}-{name}"
        )
        backlog = backlog_of(options, repeat)
        plan = Plan(
            scenario=scenario,
            label=label,
            project=self.emu.project,
            backlog=scenario_backlog(backlog, scenario),
            paced=0 if warm or profiled else options.paced,
            rate=options.rate,
            lone=0 if warm or profiled else options.lone,
            concurrency=options.concurrency,
            stall_s=options.stall_s,
            timeout_s=options.timeout_s,
            logs=self.logs,
            py_spy=self.spy if profiled or (options.py_spy and not warm) else None,
            profiles=self.raw_profiles if profiled else options.py_spy,
            env={**self.env(name), **self.place(name)},
        )
        self.progress.begin(label)
        t0 = time.monotonic()
        raw = run_once(plan, self.emu, self.publisher, self.admin, self.progress.phase)
        raw.update(scenario=name, repeat=repeat, label=label, backlog=plan.backlog)
        layout, cpus = self.layout, raw.get("consumer_cpus")  # none: no consumer started
        if layout and scenario.processes == 1 and cpus and not layout.kept_by(cpus):
            _say(
                f"warning: {label}'s consumer ran on cores {cpus}, not on "
                f"core {sorted(layout.consumer)} as the layout says (the machine refused it)"
            )
        prefix = (
            "settling " if settling else "warm-up " if warm else "profiled " if profiled else ""
        ) or f"r{repeat} "
        self.progress.end(prefix + _line(name, raw, time.monotonic() - t0))
        return raw

    @property
    def raw_profiles(self) -> Path:
        return self.logs / "profiles"

    def profile_round(self) -> None:
        """One more run of each profiled scenario, py-spy attached; its breakdown and files."""
        folder = self.options.profiles
        if folder is None:
            return
        for name in self.profile_names():
            raw = self.one(name, PROFILE_ROUND)
            label = f"profile-{name}-p0"  # the first consumer process
            messages = raw["phases"]["backlog"]["messages"] if raw["ok"] else 0
            found = breakdown(self.raw_profiles, label, messages)
            raw["breakdown"] = found
            if found is None and raw["ok"]:
                _say(
                    f"no profile of {name}: py-spy wrote none (on Linux it needs permission to "
                    "trace the consumers: root, or kernel.yama.ptrace_scope=0)"
                )
            if found is not None:
                folder.mkdir(parents=True, exist_ok=True)
                for mode in ("cpu", "wall"):
                    data = (self.raw_profiles / f"{label}-{mode}.txt").read_bytes()
                    target = folder / f"{name}-{mode}.txt.gz"
                    target.write_bytes(gzip.compress(data, mtime=0))
                    said = sampling(self.raw_profiles / f"{label}-{mode}.sampling")
                    if said is not None:  # the samples py-spy kept and dropped
                        kept, dropped = said
                        (folder / f"{name}-{mode}.sampling").write_text(
                            f"Samples: {kept} Errors: {dropped}\n"
                        )
                raw["profile_files"] = [f"{name}-{m}.txt.gz" for m in ("cpu", "wall")]
            self.profiled[name] = raw

    def profile_names(self) -> list[str]:
        """The profiled scenarios of this session; none without py-spy or a folder."""
        if self.options.profiles is None or self.spy is None:
            return []
        return [n for n in PROFILED if n in self.options.scenarios]

    def settle(self) -> None:
        """Discarded runs of :data:`SETTLE_SCENARIO` until the emulators' JIT has settled
        (:func:`settle_emulators`); none when no chosen scenario uses Firestore."""
        if any(not SCENARIOS[n].stock for n in self.options.scenarios):
            self.settling = settle_emulators(self._settling_run, self.options.settle)

    def _settling_run(self) -> float | None:
        """One discarded run of :data:`SETTLE_SCENARIO`: the Firestore emulator's CPU ms per
        message, or None if it failed."""
        self.progress.add(1)
        raw = self.one(SETTLE_SCENARIO, PROFILE_ROUND - 1)
        if not raw["ok"]:
            return None
        backlog = raw["phases"]["backlog"]
        cost: float = backlog["firestore_emulator_s"] * 1000 / max(backlog["messages"], 1)
        _say(f"  the Firestore emulator: {cost:.2f} ms of CPU per message")
        return cost

    def all(self) -> None:
        """Settling, warm-ups, then the repeats, each in a rotated order."""
        names = self.options.scenarios
        try:
            self.settle()
            if self.options.warmup:
                self.warmups += [self.one(name, 0) for name in names]
            for name, repeat in run_order(names, self.options):
                self.runs.append(self.one(name, repeat))
            self.profile_round()
        finally:
            self.publisher.close()
            if self.proxies is not None:
                self.proxies.close()
            if self.layout is not None:
                self._move(self.layout.every)  # every core given back


def _code() -> str:
    """The library's commit, and whether the measured tree differs from it."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "pubsub_worker"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {commit}" + (" with uncommitted changes" if changed else "")


def _write(report: dict[str, Any], options: Options) -> None:
    if options.plot is not None:
        from benchmarks.plot import plot  # noqa: PLC0415 - matplotlib only when plotting

        if plot(report, options.plot):
            _say(f"wrote {options.plot}")
            report["plot"] = options.plot.name
    markdown = render_markdown(report)
    sys.stdout.write(markdown)
    if options.markdown is not None:
        write_markdown(options.markdown, markdown)
        _say(f"wrote {options.markdown}")
    if options.json_path is not None:
        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        options.json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        _say(f"wrote {options.json_path}")


def session_report(options: Options, emu: Any, sdk_root: Path | None = None) -> dict[str, Any]:
    """Run the session of ``options`` on the running emulators ``emu``; its report.

    The report holds the settings, the summary, every run (warm-ups and the
    profile round apart) and, from ``sdk_root``, the emulators' versions.
    """
    started = time.monotonic()
    when = datetime.datetime.now(datetime.timezone.utc)
    total = len(run_order(options.scenarios, options)) + (
        len(options.scenarios) if options.warmup else 0
    )
    progress = _Progress(total)
    session = _Session(options, emu, progress)
    progress.add(len(session.profile_names()))
    delayed = any(SCENARIOS[name].delayed for name in options.scenarios)
    _say(
        f"emulators ready in {emu.startup_s:.1f} s; {len(options.scenarios)} scenarios "
        f"({', '.join(options.scenarios)}); {options.messages} backlog, {options.paced} "
        f"paced at {options.rate:g}/s, {options.lone} lone; {options.repeats} repeat(s) "
        f"after a warm-up; logs in {session.logs}"
        + (
            f"; delayed scenarios through loopback proxies adding {options.firestore_rtt_ms:g} "
            f"ms per Firestore and {options.pubsub_rtt_ms:g} ms per Pub/Sub round trip"
            if delayed
            else ""
        )
    )
    session.all()
    return {
        "command": options.command,
        "date": when.isoformat(timespec="seconds"),
        "duration_s": time.monotonic() - started,
        "machine": machine(),
        "cores": session.layout.describe() if session.layout else "every process on every core",
        "backlog_per_process": True,
        "versions": versions(sdk_root),
        "code": _code(),
        "options": {
            k: v
            for k, v in asdict(options).items()
            if k not in ("markdown", "json_path", "plot", "py_spy", "profiles")
        },
        "baseline": BASELINE,
        "scenarios": {n: SCENARIOS[n].label for n in options.scenarios},
        "summary": summarize(session.runs, options.scenarios, options.concurrency),
        "runs": session.runs,
        "warmups": session.warmups,
        "settling": session.settling,
        "settled": settled(session.settling),
        "profiled": session.profiled,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the session; print the Markdown report to stdout. Exit 1 if a run failed."""
    options = parse_args(argv)
    started = time.monotonic()
    if options.profiles is not None and _py_spy_path() is None:
        _say("no profile round: py-spy is not installed (pip install py-spy, or nox -s bench)")
    with emulators(PROJECT) as (emu, sdk_root):
        report = session_report(options, emu, sdk_root)
    report["duration_s"] = time.monotonic() - started  # the emulators' start included
    _write(report, options)
    _say(f"done in {time.monotonic() - started:.0f} s")
    everything = (*report["warmups"], *report["runs"], *report["profiled"].values())
    return 0 if all(run["ok"] for run in everything) else 1


if __name__ == "__main__":
    raise SystemExit(main())
