"""Benchmark the wrapper against the stock client: ``python -m benchmarks.run [--quick]``.

One session starts the real emulators and runs every scenario (see
:mod:`benchmarks.scenarios`) ``--repeats`` times, interleaved, with the order
rotated each repeat, so that whatever else the machine does hits all of them
alike. Each run:

1. creates a fresh topic and subscription (exactly-once delivery or not),
2. publishes a backlog of ``--messages`` messages,
3. starts a consumer in its own process (:mod:`benchmarks.consumer`) and
   measures the throughput phase: first callback to last ack of the backlog,
   with Firestore and Pub/Sub RPCs counted by a gRPC interceptor and the CPU
   time of the consumer and of both emulators read from ``/proc``,
4. then publishes ``--paced`` messages at ``--rate`` per second, a load every
   scenario sustains, for end-to-end latency (publish time to ack done),
5. reads the consumer's peak RSS.

Ratios are computed within a repeat (scenario / stock EOD of the same repeat)
and summarised by their median. Results go to stdout (Markdown), to
``docs/benchmarks.md`` (between generated-section markers, so prose around
them survives) and to ``.nox/bench.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any, TextIO

from benchmarks.consumer import ConsumerConfig
from benchmarks.report import render_markdown, summarize, write_markdown
from benchmarks.scenarios import BASELINE, DEFAULT_SCENARIOS, SCENARIOS, Scenario

__all__ = ["Options", "main"]

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "pubsub-worker-bench"
PAYLOAD_BYTES = 256
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Options:
    """What a benchmark session does."""

    scenarios: tuple[str, ...]
    messages: int
    paced: int
    rate: float
    repeats: int
    concurrency: int
    warmup: int
    timeout_s: float
    markdown: Path | None
    json_path: Path | None
    command: str
    py_spy: Path | None = None


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Read the command line; ``--quick`` changes the defaults, explicit values win."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Wrapper vs stock Pub/Sub client on the local emulators, in one session.",
    )
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run")
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated, from: {', '.join(SCENARIOS)} (default: %(default)s)",
    )
    parser.add_argument("--messages", type=int, help="backlog per run (default 1500; quick 300)")
    parser.add_argument("--paced", type=int, help="paced messages per run (default 200; quick 60)")
    parser.add_argument("--rate", type=float, default=100.0, help="paced msg/s (default 100)")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 5; quick 2)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=10,
        help="flow control max_messages = callback threads, all scenarios (default 10)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help="messages of one discarded warm-up run per scenario (default 1000; quick 150)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
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
        "--py-spy",
        metavar="DIR",
        help="profile each measured consumer's throughput phase with py-spy (collapsed "
        "stacks in DIR; the sampling perturbs the numbers: a diagnostic, not a measurement)",
    )
    args = parser.parse_args(argv)
    if args.py_spy and _py_spy_path() is None:
        parser.error("--py-spy needs py-spy (pip install py-spy)")
    names = tuple(n.strip() for n in args.scenarios.split(",") if n.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    if BASELINE not in names:
        names = (BASELINE, *names)
    quick = args.quick

    def pick(value: Any, normal: Any, fast: Any) -> Any:
        return value if value is not None else (fast if quick else normal)

    given = list(sys.argv[1:] if argv is None else argv)
    return Options(
        scenarios=names,
        messages=pick(args.messages, 1500, 300),
        paced=pick(args.paced, 200, 60),
        rate=args.rate,
        repeats=pick(args.repeats, 5, 2),
        concurrency=args.concurrency,
        warmup=pick(args.warmup, 1000, 150),
        timeout_s=args.timeout,
        markdown=None if args.markdown == "-" else Path(args.markdown),
        json_path=None if args.json == "-" else Path(args.json),
        command=shlex.join(["python", "-m", "benchmarks.run", *given]),
        py_spy=Path(args.py_spy) if args.py_spy else None,
    )


def _py_spy_path() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


# -- CPU accounting ---------------------------------------------------------------------


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from ``/proc`` (0 when unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from ``/proc/stat``."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return (0, 0)
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values) - idle, sum(values))


@dataclass
class _CpuMark:
    at: float
    emulators: dict[str, float]
    machine: tuple[int, int]
    orchestrator: float


def _mark(pids: dict[str, int]) -> _CpuMark:
    return _CpuMark(
        at=time.perf_counter(),
        emulators={name: _process_cpu_s(pid) for name, pid in pids.items()},
        machine=_machine_jiffies(),
        orchestrator=time.process_time(),
    )


def _cpu_between(start: _CpuMark, end: _CpuMark) -> dict[str, float]:
    out = {f"{n}_emulator_s": end.emulators[n] - start.emulators[n] for n in start.emulators}
    busy = end.machine[0] - start.machine[0]
    total = end.machine[1] - start.machine[1]
    out["machine_busy"] = busy / total if total else 0.0
    out["machine_busy_s"] = busy / _CLK_TCK
    out["orchestrator_s"] = end.orchestrator - start.orchestrator
    out["wall_s"] = end.at - start.at
    return out


# -- one run ------------------------------------------------------------------------------


class _Session:
    """The emulators and the clients the orchestrator uses to set runs up."""

    def __init__(self, options: Options, emulators: Any) -> None:
        import google.cloud.pubsub_v1 as pubsub_v1  # noqa: PLC0415

        from emulator.bootstrap import publisher_admin, subscriber_admin  # noqa: PLC0415

        self.options = options
        self.emulators = emulators
        host = emulators.pubsub_host
        self.admin_publisher = publisher_admin(host)
        self.admin_subscriber = subscriber_admin(host)
        self.publisher = pubsub_v1.PublisherClient()
        self.logs = Path(tempfile.mkdtemp(prefix="bench-consumers-"))
        self.payload = os.urandom(PAYLOAD_BYTES)

    def close(self) -> None:
        self.publisher.stop()

    def publish(self, topic: str, count: int, phase: str, rate: float | None) -> None:
        """Publish ``count`` messages; at ``rate`` per second when given, else at once."""
        futures: list[Future[str]] = []
        start = time.perf_counter()
        for i in range(count):
            if rate:
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            futures.append(self.publisher.publish(topic, self.payload, phase=phase, seq=str(i)))
        for future in futures:
            future.result(timeout=60)

    def run(self, scenario: Scenario, *, messages: int, paced: int, label: str) -> dict[str, Any]:
        """One consumer process on a fresh subscription; returns its measurements."""
        from emulator import create_subscription, delete_subscription  # noqa: PLC0415

        handle = create_subscription(
            project=PROJECT,
            publisher=self.admin_publisher,
            subscriber=self.admin_subscriber,
            exactly_once=scenario.eod,
            ack_deadline_seconds=60,
            prefix="bench",
        )
        try:
            if scenario.kind == "wrapped":
                self.emulators.reset_firestore()
            self.publish(handle.topic_path, messages, "backlog", None)
            config = ConsumerConfig(
                scenario=scenario.name,
                subscription=handle.subscription_path,
                project=PROJECT,
                collection=f"bench_{uuid.uuid4().hex[:12]}",
                backlog=messages,
                paced=paced,
                concurrency=self.options.concurrency,
                timeout_s=self.options.timeout_s,
            )
            log_path = self.logs / f"{label}.log"
            with log_path.open("w") as log:
                result = self._consume(config, handle.topic_path, paced, log, label)
            result["log"] = str(log_path)
            return result
        finally:
            delete_subscription(
                handle, publisher=self.admin_publisher, subscriber=self.admin_subscriber
            )

    def _py_spy(self, pid: int, label: str) -> subprocess.Popen[bytes] | None:
        folder = self.options.py_spy
        if folder is None or label.startswith("warmup"):
            return None
        folder.mkdir(parents=True, exist_ok=True)
        exe = _py_spy_path()
        assert exe is not None  # checked with the arguments
        spy = subprocess.Popen(
            [
                *(exe, "record", "--pid", str(pid), "--rate", "200", "--nonblocking", "--gil"),
                *("--format", "raw", "--output", str(folder / f"{label}.txt")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached before the measurement starts
        return spy

    def _consume(
        self, config: ConsumerConfig, topic: str, paced: int, log: TextIO, label: str
    ) -> dict[str, Any]:
        env = {**os.environ, **self.emulators.env(), "PYTHONPATH": str(ROOT)}
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.consumer", json.dumps(asdict(config))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=ROOT,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            events = _events(process.stdout)
            ready = _expect(events, "ready", log)
            spy = self._py_spy(process.pid, label)
            start = _mark(self.emulators.pids)
            process.stdin.write("go\n")
            process.stdin.flush()
            drained = _expect(events, "drained", log)
            end = _mark(self.emulators.pids)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=30)
            if paced:
                self.publish(topic, paced, "paced", self.options.rate)
            result = _expect(events, "result", log)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return {"ready": ready, "drained": drained, "result": result, **_cpu_between(start, end)}


def _events(stream: IO[str]) -> Iterator[dict[str, Any]]:
    for raw in stream:
        line = raw.strip()
        if line.startswith("{"):
            yield json.loads(line)


def _expect(events: Iterator[dict[str, Any]], name: str, log: TextIO) -> dict[str, Any]:
    for event in events:
        if event.get("event") == name:
            return event
    log.flush()
    tail = Path(log.name).read_text()[-3000:]
    raise RuntimeError(f"the consumer exited before {name!r}; its log ends:\n{tail}")


# -- reporting helpers ----------------------------------------------------------------------


def _flatten(scenario: Scenario, repeat: int, raw: dict[str, Any], messages: int) -> dict[str, Any]:
    drained, result = raw["drained"], raw["result"]
    fs_calls = sum(drained["firestore"]["calls"].values())
    fs_items = sum(drained["firestore"]["items"].values())
    done = max(drained["done"].get("backlog", 0), 1)
    return {
        "scenario": scenario.name,
        "repeat": repeat,
        "ok": bool(drained["ok"] and result["ok"]),
        "messages": messages,
        "msgs_per_s": drained["msgs_per_s"],
        "elapsed_s": drained["elapsed_s"],
        "firestore_rpcs_per_msg": fs_calls / done,
        "firestore_writes_per_msg": fs_items / done,
        "firestore_calls": drained["firestore"]["calls"],
        "pubsub_calls": drained["pubsub"]["calls"],
        "pubsub_items": drained["pubsub"]["items"],
        "pubsub_rpcs_per_msg": sum(drained["pubsub"]["calls"].values()) / done,
        "latency_ms": result["latency_ms"],
        "service_ms": drained["service_ms"],
        "occupancy": drained["occupancy"],
        "paced_service_ms": result["paced_service_ms"],
        "peak_rss_mb": result["peak_rss_mb"],
        "rss_ready_mb": result["rss_ready_mb"],
        "cpu_ms_per_msg": {
            "consumer": drained["cpu_s"] * 1000 / done,
            "firestore_emulator": raw.get("firestore_emulator_s", 0.0) * 1000 / done,
            "pubsub_emulator": raw.get("pubsub_emulator_s", 0.0) * 1000 / done,
        },
        "machine_busy": raw["machine_busy"],
        "other_load_cores": _other_load(raw),
        "repeats_seen": result["repeats"],
        "callbacks": result["callbacks"],
        "metrics": result["metrics"],
        "log": raw["log"],
    }


def _other_load(raw: dict[str, Any]) -> float:
    """CPU cores busy with anything but this benchmark during the throughput phase."""
    ours = (
        raw["drained"]["cpu_s"]
        + raw.get("firestore_emulator_s", 0.0)
        + raw.get("pubsub_emulator_s", 0.0)
        + raw["orchestrator_s"]
    )
    return float(max(raw["machine_busy_s"] - ours, 0.0) / max(raw["wall_s"], 1e-9))


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _versions(sdk_root: Path | None) -> dict[str, str]:
    versions: dict[str, str] = {}
    for dist in ("google-cloud-pubsub", "google-cloud-firestore", "grpcio", "protobuf"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "?"
    if sdk_root is not None:
        for component, name in (
            ("pubsub-emulator", "Pub/Sub emulator"),
            ("cloud-firestore-emulator", "Firestore emulator"),
        ):
            try:
                snapshot = json.loads(
                    (sdk_root / ".install" / f"{component}.snapshot.json").read_text()
                )
                found = next(c for c in snapshot["components"] if c["id"] == component)
                versions[name] = found["version"]["version_string"]
            except (OSError, ValueError, KeyError, StopIteration):
                versions[name] = "?"
        try:
            versions["Google Cloud CLI"] = (sdk_root / "VERSION").read_text().strip()
        except OSError:
            versions["Google Cloud CLI"] = "?"
    return versions


def _machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


@contextmanager
def _emulators() -> Iterator[tuple[Any, Path | None]]:
    from emulator import find_components, start_emulators  # noqa: PLC0415
    from emulator.errors import EmulatorError  # noqa: PLC0415

    try:
        sdk_root: Path | None = find_components().sdk_root
    except EmulatorError:
        sdk_root = None  # the Docker backend
    with start_emulators(project=PROJECT) as emu:
        emu.export_env()
        yield emu, sdk_root


def main(argv: Sequence[str] | None = None) -> int:
    """Run the session; print the Markdown report to stdout. Exit 1 if a run failed."""
    options = parse_args(argv)
    started = time.monotonic()
    when = datetime.datetime.now(datetime.timezone.utc)
    runs: list[dict[str, Any]] = []
    with _emulators() as (emu, sdk_root):
        _progress(
            f"emulators ready in {emu.startup_s:.1f} s; scenarios {', '.join(options.scenarios)}; "
            f"{options.messages} backlog + {options.paced} paced at {options.rate:g}/s; "
            f"{options.repeats} repeat(s); concurrency {options.concurrency}"
        )
        session = _Session(options, emu)
        try:
            if options.warmup:
                for name in options.scenarios:
                    scenario = SCENARIOS[name]
                    raw = session.run(
                        scenario, messages=options.warmup, paced=0, label=f"warmup-{name}"
                    )
                    _progress(
                        f"  warm-up {name:<18} {raw['drained']['msgs_per_s']:7.0f} msg/s "
                        "(discarded)"
                    )
            for repeat in range(options.repeats):
                shift = repeat % len(options.scenarios)
                order = options.scenarios[shift:] + options.scenarios[:shift]
                for name in order:
                    scenario = SCENARIOS[name]
                    t0 = time.monotonic()
                    raw = session.run(
                        scenario,
                        messages=options.messages,
                        paced=options.paced,
                        label=f"r{repeat + 1}-{name}",
                    )
                    run = _flatten(scenario, repeat + 1, raw, options.messages)
                    runs.append(run)
                    _progress(
                        f"  [{repeat + 1}/{options.repeats}] {name:<18} "
                        f"{run['msgs_per_s']:7.0f} msg/s  "
                        f"{run['firestore_rpcs_per_msg']:.2f} Firestore RPC/msg  "
                        f"p50 {run['latency_ms']['p50'] or 0:6.1f} ms  "
                        f"p99 {run['latency_ms']['p99'] or 0:6.1f} ms  "
                        f"RSS {run['peak_rss_mb']:5.0f} MB  "
                        f"others {run['other_load_cores']:.2f} cores  "
                        f"({time.monotonic() - t0:.1f} s){'' if run['ok'] else '  FAILED'}"
                    )
        finally:
            session.close()
        versions = _versions(sdk_root)
    summary = summarize(runs, options.scenarios, BASELINE)
    report = {
        "command": options.command,
        "date": when.isoformat(timespec="seconds"),
        "duration_s": time.monotonic() - started,
        "machine": _machine(),
        "versions": versions,
        "options": {k: v for k, v in asdict(options).items() if k not in ("markdown", "json_path")},
        "scenarios": {n: SCENARIOS[n].label for n in options.scenarios},
        "summary": summary,
        "runs": runs,
    }
    markdown = render_markdown(report)
    sys.stdout.write(markdown)
    if options.markdown is not None:
        write_markdown(options.markdown, markdown)
        _progress(f"wrote {options.markdown}")
    if options.json_path is not None:
        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        options.json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        _progress(f"wrote {options.json_path}")
    _progress(f"done in {time.monotonic() - started:.0f} s")
    return 0 if all(run["ok"] for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
