"""One run of a scenario: a fresh subscription, its consumer processes, its phases, bounded.

Phases, each closed by the orchestrator once every message it published in
that phase was acked, by whichever process got it:

1. ``backlog``: ``backlog`` messages are published first, then the consumers
   start together; throughput is the backlog over first callback to last ack
   of the fleet. CPU (each consumer's own, each emulator's from ``/proc``,
   the machine's) and RPCs are counted over this phase.
2. ``paced`` (latency scenarios): messages published at ``rate`` per second,
   a load every scenario sustains; latency is publish time to ack answered.
3. ``lone`` (latency scenarios): messages published one at a time, the next
   once the last was acked: what a lone message costs in RPCs.

Every wait is bounded: a phase in which no message is acked for ``stall_s``
seconds, or that outlasts ``timeout_s``, ends the run as *stalled*, with what
was acked, what each process still holds and its log; a consumer that exits
early ends it as failed with its log's tail. Nothing here hangs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks import profile
from benchmarks.consumer import ConsumerConfig
from benchmarks.machine import mark
from benchmarks.measure import cpu_shares, phase_stats
from benchmarks.scenarios import Scenario

__all__ = ["ConsumerFailed", "Plan", "Publisher", "Stalled", "run_once"]

ROOT = Path(__file__).resolve().parent.parent

Progress = Callable[[str, int, int, float], None]
"""Called as ``(phase, acked, published, seconds into the phase)`` while a phase runs."""

COLLECTION = "bench_jobs"
"""The job documents' collection, the same in every run: the Firestore emulator keeps state
per collection that a reset does not free, and a new collection per run made each write cost
it more CPU as the session went on (1.0 to 2.2 ms per one-step job over 40 runs of 1,500; with
one collection 0.4-0.5 ms)."""

_READY_S = 90.0
_MARK_S = 15.0


class Stalled(Exception):
    """A phase stopped making progress (or outlasted its bound): a bug, reported as such."""


class ConsumerFailed(Exception):
    """A consumer process exited, or never became ready."""


@dataclass(frozen=True)
class Plan:
    """What one run does."""

    scenario: Scenario
    label: str
    """Names the run's logs and profiles (``r2-wrapped-1``)."""
    project: str
    backlog: int
    paced: int
    rate: float
    lone: int
    concurrency: int
    stall_s: float
    timeout_s: float
    logs: Path
    py_spy: str | None = None
    """The py-spy executable, to profile the backlog phase; None: no profile."""
    profiles: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """The consumers' environment over the emulators' own (a delayed scenario: the delay
    proxies' addresses). The orchestrator itself always talks to the emulators directly."""


class Publisher:
    """Publishes a phase's messages and returns their ids."""

    def __init__(self, payload_bytes: int) -> None:
        import google.cloud.pubsub_v1 as pubsub_v1  # noqa: PLC0415

        self._client = pubsub_v1.PublisherClient()
        self._default = payload_bytes
        self._payloads: dict[int, bytes] = {}

    def payload(self, size: int | None) -> bytes:
        """Random bytes of ``size`` (the session's default when None), the same every run."""
        size = size or self._default
        if size not in self._payloads:
            self._payloads[size] = os.urandom(size)
        return self._payloads[size]

    def publish(
        self, topic: str, data: bytes, count: int, phase: str, rate: float | None = None
    ) -> list[str]:
        """Publish ``count`` messages; at ``rate`` per second when given, else at once."""
        futures: list[Future[str]] = []
        start = time.monotonic()
        for i in range(count):
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            futures.append(self._client.publish(topic, data, phase=phase, seq=str(i)))
        return [future.result(timeout=120) for future in futures]

    def close(self) -> None:
        self._client.stop()


@dataclass
class _Member:
    """One consumer process and what it said."""

    index: int
    process: subprocess.Popen[str]
    log: IO[str]
    pid: int = 0
    ready: dict[str, Any] = field(default_factory=dict)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    leased: int = 0
    alive: bool = True
    reader: threading.Thread | None = None

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise ConsumerFailed(f"consumer {self.index} is gone: {self.tail()}") from exc

    def tail(self, chars: int = 3000) -> str:
        self.log.flush()
        try:
            return Path(self.log.name).read_text()[-chars:] or "(empty log)"
        except OSError:
            return "(no log)"


class _Fleet:
    """The consumer processes of one run and the pump that reads their events."""

    def __init__(self, plan: Plan, subscription: str, env: Mapping[str, str]) -> None:
        self._plan = plan
        self._events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self.members: list[_Member] = []
        self.done: dict[str, list[Any]] = {}  # message id -> first finished record
        self.repeats = 0
        collection = COLLECTION  # emptied before every wrapped run
        try:
            for index in range(plan.scenario.processes):
                self._start(index, subscription, collection, env)
        except BaseException:
            self.stop()  # the ones already started
            raise

    def _start(
        self, index: int, subscription: str, collection: str, env: Mapping[str, str]
    ) -> None:
        """Start consumer ``index`` and the thread that reads what it says."""
        plan = self._plan
        config = ConsumerConfig(
            scenario=plan.scenario.name,
            subscription=subscription,
            project=plan.project,
            collection=collection,
            concurrency=plan.concurrency,
            index=index,
        )
        log = (plan.logs / f"{plan.label}-p{index}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.consumer", json.dumps(asdict(config))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        member = _Member(index, process, log, pid=process.pid)
        self.members.append(member)
        member.reader = threading.Thread(
            target=self._read, args=(member,), name=f"bench-read-{index}", daemon=True
        )
        member.reader.start()

    def _read(self, member: _Member) -> None:
        assert member.process.stdout is not None
        for raw in member.process.stdout:
            line = raw.strip()
            if line.startswith("{"):
                try:
                    self._events.put((member.index, json.loads(line)))
                except ValueError:
                    pass  # a library printed something JSON-like: not ours
        self._events.put((member.index, None))

    def pump(self, timeout_s: float) -> int:
        """Handle the events that arrive within ``timeout_s``; returns newly acked messages."""
        new = 0
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                index, event = self._events.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                return new
            member = self.members[index]
            if event is None:
                member.alive = False
                if member.result is None:
                    raise ConsumerFailed(
                        f"consumer {index} exited early; its log ends:\n{member.tail()}"
                    )
                continue
            name = event.get("event")
            if name == "progress":
                member.leased = int(event.get("leased", 0))
                for record in event["done"]:
                    if record[0] in self.done:
                        self.repeats += 1
                    else:
                        self.done[record[0]] = [*record, index]  # which process finished it
                        new += 1
            elif name == "mark":
                member.marks[event["name"]] = event
            elif name == "ready":
                member.ready = event
            elif name == "result":
                member.result = event
            if time.monotonic() >= deadline:
                return new

    def until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise ConsumerFailed(f"no {what} within {timeout_s:.0f} s")
            self.pump(0.05)

    def send_all(self, command: str) -> None:
        for member in self.members:
            member.send(command)

    def mark_all(self, name: str) -> None:
        self.send_all(f"mark {name}")
        self.until(lambda: all(name in m.marks for m in self.members), _MARK_S, f"{name} mark")

    def wait_acked(
        self, ids: Sequence[str], phase: str, progress: Progress | None, lone: bool = False
    ) -> None:
        """Pump until every message of ``ids`` was acked; raise :class:`Stalled` if it stops."""
        plan = self._plan
        wanted = set(ids)
        started = last_new = last_report = time.monotonic()
        acked = len(wanted & self.done.keys())
        while acked < len(wanted):
            if self.pump(0.01 if lone else 0.1):
                acked = len(wanted & self.done.keys())
                last_new = time.monotonic()
            now = time.monotonic()
            if progress is not None and not lone and now - last_report >= 0.5:
                progress(phase, acked, len(wanted), now - started)
                last_report = now
            quiet, running = now - last_new, now - started
            if quiet > plan.stall_s or running > plan.timeout_s:
                held = ", ".join(f"p{m.index}: {m.leased}" for m in self.members)
                why = (
                    f"no ack for {quiet:.0f} s"
                    if quiet > plan.stall_s
                    else f"phase over its {plan.timeout_s:.0f} s bound"
                )
                raise Stalled(
                    f"{phase}: {acked} of {len(wanted)} messages acked after {running:.0f} s, "
                    f"{why}; messages the client still holds per process: {held}"
                )
        if progress is not None and not lone:
            progress(phase, acked, len(wanted), time.monotonic() - started)

    def stop(self) -> None:
        """Ask for the results (briefly), then make sure every process is gone."""
        try:
            self.send_all("exit")
            self.until(lambda: all(m.result is not None for m in self.members), _MARK_S, "result")
        except (ConsumerFailed, Stalled):
            pass  # the measurement is out, or the run failed already
        for member in self.members:
            try:
                member.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()
            if member.reader is not None:
                member.reader.join(timeout=10)  # it reads to the end of the gone process's output
            for pipe in (member.process.stdin, member.process.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):  # stdin: what was left unsent is moot
                        pipe.close()
            member.log.close()


def run_once(
    plan: Plan,
    emulators: Any,
    publisher: Publisher,
    admin: tuple[Any, Any],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """One run of ``plan`` on a fresh subscription; its measurements (``ok`` False if not)."""
    from emulator import create_subscription, delete_subscription  # noqa: PLC0415

    scenario = plan.scenario
    admin_publisher, admin_subscriber = admin
    handle = create_subscription(
        project=plan.project,
        publisher=admin_publisher,
        subscriber=admin_subscriber,
        exactly_once=scenario.eod,
        ack_deadline_seconds=60,
        prefix="bench",
    )  # no retry policy: with one, killed subscribers can stall the emulator for good
    out: dict[str, Any] = {"ok": False, "stalled": None, "error": None, "phases": {}}
    fleet: _Fleet | None = None
    try:
        if not scenario.stock:
            emulators.reset_firestore()
        data = publisher.payload(scenario.payload_bytes)
        backlog = publisher.publish(handle.topic_path, data, plan.backlog, "backlog")
        env = {**os.environ, **emulators.env(), **plan.env}
        fleet = _Fleet(plan, handle.subscription_path, env)
        _measure(plan, fleet, emulators.pids, backlog, progress, out["phases"])
        publish = functools.partial(publisher.publish, handle.topic_path, data)
        _latency(plan, fleet, publish, progress, out["phases"])
        out["ok"] = True
    except Stalled as exc:
        out["stalled"] = str(exc)
    except ConsumerFailed as exc:
        out["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - a failed run is reported; the session goes on
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if fleet is not None:
            fleet.stop()
            out.update(_process_summary(fleet))
        delete_subscription(handle, publisher=admin_publisher, subscriber=admin_subscriber)
    out["logs"] = [str(plan.logs / f"{plan.label}-p{i}.log") for i in range(scenario.processes)]
    return out


def _measure(
    plan: Plan,
    fleet: _Fleet,
    pids: Mapping[str, int],
    backlog: Sequence[str],
    progress: Progress | None,
    phases: dict[str, Any],
) -> None:
    """The throughput phase: every process starts at once; CPU is counted around it."""
    fleet.until(lambda: all(m.ready for m in fleet.members), _READY_S, "ready consumers")
    spies = []
    if plan.py_spy is not None and plan.profiles is not None:
        spies = profile.record(
            plan.py_spy, {f"{plan.label}-p{m.index}": m.pid for m in fleet.members}, plan.profiles
        )
    try:
        before = mark(pids)
        fleet.send_all("go")
        fleet.until(lambda: all("start" in m.marks for m in fleet.members), _MARK_S, "start")
        fleet.wait_acked(backlog, "backlog", progress)
        fleet.mark_all("backlog")
        after = mark(pids)
    finally:
        profile.stop(spies)
    phases["backlog"] = _phase(fleet, backlog, "start", "backlog", plan)
    phases["backlog"].update(cpu_shares(before, after, fleet.members))


def _latency(
    plan: Plan,
    fleet: _Fleet,
    publish: Callable[..., list[str]],
    progress: Progress | None,
    phases: dict[str, Any],
) -> None:
    """The paced and lone phases, for the scenarios that report latency."""
    if not plan.scenario.latency:
        return
    previous = "backlog"
    if plan.paced:
        paced = publish(plan.paced, "paced", plan.rate)
        fleet.wait_acked(paced, "paced", progress)
        fleet.mark_all("paced")
        phases["paced"] = _phase(fleet, paced, previous, "paced", plan)
        previous = "paced"
    if plan.lone:
        lone: list[str] = []
        for _ in range(plan.lone):
            lone += publish(1, "lone")
            fleet.wait_acked(lone[-1:], "lone", progress, lone=True)
        fleet.mark_all("lone")
        phases["lone"] = _phase(fleet, lone, previous, "lone", plan)


def _phase(fleet: _Fleet, ids: Sequence[str], first: str, last: str, plan: Plan) -> dict[str, Any]:
    """One phase's figures from the records of its messages and the marks around it."""
    records = [fleet.done[i] for i in ids if i in fleet.done]
    slots = plan.scenario.threads(plan.concurrency) * plan.scenario.processes
    return phase_stats(records, fleet.members, first, last, slots)


def _process_summary(fleet: _Fleet) -> dict[str, Any]:
    """What the processes said at the end: RSS, the wrapper's metrics and outcomes."""
    metrics: dict[str, float] = {}
    outcomes: dict[str, int] = {}
    warnings: dict[str, int] = {}
    for member in fleet.members:
        result = member.result or {}
        for text, count in (result.get("client_warnings") or {}).items():
            warnings[text] = warnings.get(text, 0) + int(count)
        for name, value in (result.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                metrics[name] = metrics.get(name, 0) + value
        for name, value in (result.get("outcomes") or {}).items():
            outcomes[name] = outcomes.get(name, 0) + int(value)
    return {
        "rss_ready_mb": [m.ready.get("rss_mb", 0.0) for m in fleet.members],
        "consumer_cpus": [m.ready.get("cpus") for m in fleet.members],
        "peak_rss_mb": [
            (m.result or m.marks.get("backlog") or {}).get("peak_rss_mb", 0.0)
            for m in fleet.members
        ],
        "metrics": metrics,
        "outcomes": outcomes,
        "client_warnings": warnings,
        "ack_failures": sum(int((m.result or {}).get("ack_failures", 0)) for m in fleet.members),
        "redeliveries": fleet.repeats,
        "pids": [m.pid for m in fleet.members],
    }
