"""One chaos run, start to verdict: resources, fleet, faults, drain, counting.

Phases, each bounded in time (``Options.time_limit_s`` in all):

1. **Set-up.** A fresh exactly-once subscription with the lease as its ack
   deadline and *no retry policy*, an output topic with the downstream
   consumer's subscription, a failure topic with one of its own, fresh
   Firestore collections. Per worker, two
   :class:`~benchmarks.chaos.grpc_proxy.GrpcFaultProxy` (Pub/Sub, Firestore)
   and a :class:`~emulator.TcpProxy` link in front of each
   (:mod:`benchmarks.chaos.fleet`). The fleet starts, and the jobs are
   published at a steady rate (see :class:`Feeder`).
2. **Faults.** From the first delivery on, the seeded schedule is carried
   out while work remains: until every job is completed or failed, or until
   ``Options.fault_time_s`` passed, or until :data:`DRAIN_RESERVE_S` (at
   most a third of the run) before the time limit. A fault still in effect
   then runs its course (paused workers are resumed, links healed, killed
   workers restarted, error and latency windows closed when they are due),
   or is undone at once if the work is done or the time limit is reached.
3. **Drain.** The fleet runs on until every job message has an accepted
   ack (seen at the proxy) or time is up; then it gets SIGTERM.
4. **Counting.** With no worker left, the emulator's stale streams are ended
   and the subscription is pulled for one lease and a margin: any message
   still there was left unacked. The consumers drain their topics; the job
   documents, business writes, effect lines and worker counters are read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from benchmarks.chaos import collect
from benchmarks.chaos.downstream import KeyedConsumer
from benchmarks.chaos.feeder import KEY_ATTRIBUTE, Feeder, job_specs
from benchmarks.chaos.fleet import Fleet
from benchmarks.chaos.injector import Injector
from benchmarks.chaos.ledger import Ledger
from benchmarks.chaos.options import Options
from benchmarks.chaos.report import progress_line
from benchmarks.chaos.schedule import Fault, build_schedule
from benchmarks.chaos.verify import Evidence, verify

__all__ = ["DRAIN_RESERVE_S", "PROJECT", "STOP", "SUBSCRIPTION_NOTE", "run_chaos"]

PROJECT = "pubsub-worker-chaos"
DRAIN_RESERVE_S = 45.0
"""Faults stop at the latest this long before the time limit, so that the fleet can drain."""
FIRST_ROUND_GRACE_S = 20.0
"""How long the fault phase may run over to let the first fault of a kind find room."""
FINAL_MARGIN_S = 2.0
PROGRESS_EVERY_S = 2.0
MAX_UNEXPECTED_EXITS = 8
"""A fleet whose workers die by themselves this often is broken: the run stops."""

SUBSCRIPTION_NOTE = (
    "no retry policy: on the emulator, a retry policy plus killed subscribers stops "
    "redelivery for good (docs/emulator.md); production Pub/Sub has no such failure"
)


STOP = threading.Event()
"""Set to stop every run in progress (Ctrl-C while seeds run in parallel)."""


class Output(Protocol):
    """Where progress goes: a text stream."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class RunAborted(RuntimeError):
    """The fleet cannot run (a worker keeps dying at start-up, an emulator died)."""


def _worker_env(
    options: Options, emulators: Any, names: dict[str, str], logs: Path
) -> dict[str, str]:
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PUBSUB_WORKER_", "CHAOS_"))
        and key not in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")
    }
    env = {
        **inherited,
        "GOOGLE_CLOUD_PROJECT": emulators.project,
        "PUBSUB_WORKER_SUBSCRIPTION": names["subscription"],
        "PUBSUB_WORKER_COLLECTION": names["collection"],
        "PUBSUB_WORKER_KEY_ATTRIBUTE": KEY_ATTRIBUTE,
        "PUBSUB_WORKER_LEASE_SECONDS": str(options.lease_s),
        "PUBSUB_WORKER_MAX_PROCESSING_SECONDS": str(max(120, options.lease_s)),
        "PUBSUB_WORKER_MAX_MESSAGES": str(options.max_messages),
        "PUBSUB_WORKER_FAILURE_TOPIC": names["failure_topic"],
        "PUBSUB_WORKER_ACK_TIMEOUT_SECONDS": "20",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "2",
        "PUBSUB_WORKER_LOG_FORMAT": "json",
        "CHAOS_EFFECTS": str(logs / "effects.jsonl"),
        "CHAOS_SINK_COLLECTION": names["sink"],
        "CHAOS_OUTPUT_TOPIC": names["output_topic"],
        "CHAOS_STORE": options.store,
    }
    if options.unfenced:
        env["CHAOS_UNFENCED"] = "1"
    return env


class _Run:
    """The state of one run; :meth:`execute` does it all and always cleans up."""

    def __init__(self, options: Options, emulators: Any, out: Output) -> None:
        from google.cloud import firestore  # noqa: PLC0415

        from emulator.bootstrap import publisher_admin, subscriber_admin  # noqa: PLC0415

        self.options = options
        self.emulators = emulators
        self.out = out
        self.publisher = publisher_admin(emulators.pubsub_host)
        self.subscriber = subscriber_admin(emulators.pubsub_host)
        self.firestore = firestore.Client(project=emulators.project)
        self.specs = job_specs(options)
        self.published: dict[str, str] = {}  # message id -> job key
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.progress_at = 0.0
        self.terminal = (0, 0)
        self.unexpected_exits = 0

    # -- the run --------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        from emulator import create_subscription  # noqa: PLC0415
        from emulator.names import unique_id  # noqa: PLC0415

        options = self.options
        keep = options.log_dir is not None
        logs = options.log_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
        logs = logs / f"seed-{options.seed}" if keep else logs
        logs.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            if not keep:
                stack.callback(shutil.rmtree, logs, True)
            admin = {"project": self.emulators.project, "publisher": self.publisher}
            admin["subscriber"] = self.subscriber
            jobs = create_subscription(
                **admin, exactly_once=True, ack_deadline_seconds=options.lease_s, prefix="chaos"
            )
            outputs = create_subscription(**admin, exactly_once=False, prefix="chaos-out")
            failures = create_subscription(**admin, exactly_once=False, prefix="chaos-failed")
            names = {
                "subscription": jobs.subscription_path,
                "collection": unique_id("chaos-jobs"),
                "sink": unique_id("chaos-sink"),
                "output_topic": outputs.topic_path,
                "failure_topic": failures.topic_path,
            }
            ledger = Ledger(jobs.subscription_path)
            fleet = Fleet(
                options.workers,
                pubsub_host=self.emulators.pubsub_host,
                firestore_host=self.emulators.firestore_host,
                env=_worker_env(options, self.emulators, names, logs),
                log_dir=logs,
                seed=options.seed,
                observer=ledger.for_worker,
            )
            stack.callback(fleet.close)
            out_consumer = KeyedConsumer(
                self.subscriber, outputs.subscription_path, key_attribute="effect_key"
            )
            fail_consumer = KeyedConsumer(
                self.subscriber, failures.subscription_path, key_attribute=KEY_ATTRIBUTE
            )
            for consumer in (out_consumer, fail_consumer):
                consumer.start()
                stack.callback(consumer.stop)
            injector = Injector(
                fleet,
                error_ratio=options.error_ratio,
                max_impaired=options.max_impaired,
                ready=lambda worker: ledger.pulling_since(worker.name, worker.started_wall),
            )
            self._say(
                f"chaos seed {options.seed}: {options.label}, lease {options.lease_s} s, "
                f"{options.max_messages} in flight per worker, store {options.store}"
                f"{', UNFENCED (must fail)' if options.unfenced else ''}; subscription "
                f"{jobs.subscription_path} (exactly-once, {SUBSCRIPTION_NOTE})"
            )
            feeder = Feeder(jobs.topic_path, self.specs, self.options.publish_rate)
            stack.callback(feeder.stop)
            fleet.start()
            feeder.start()
            phases = self._loop(fleet, injector, ledger, feeder, names["collection"])
            self.published = feeder.published()
            fleet.stop()
            left = collect.left_unacked(
                self.subscriber, jobs.subscription_path, wait_s=options.lease_s + FINAL_MARGIN_S
            )
            out_consumer.drain()
            fail_consumer.drain()
            return self._report(
                names, phases, ledger, injector, fleet, out_consumer, fail_consumer, left, logs
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _loop(
        self, fleet: Fleet, injector: Injector, ledger: Ledger, feeder: Feeder, collection: str
    ) -> dict[str, Any]:
        options = self.options
        events = deque(
            build_schedule(
                options.seed,
                options.rates,
                workers=options.workers,
                horizon_s=options.time_limit_s,
                lease_s=options.lease_s,
            )
        )
        # Faults stop in time for the fleet to drain: a reserve of at most a third of the run.
        hard_stop = options.time_limit_s - min(DRAIN_RESERVE_S, options.time_limit_s / 3)
        fault_until = hard_stop
        faults_from: float | None = None  # run time of the first delivery
        faults_over: float | None = None
        drained: float | None = None
        while True:
            now = self._now()
            if feeder.failure is not None:
                raise RunAborted(f"publishing the jobs failed: {feeder.failure!r}")
            if STOP.is_set():
                raise RunAborted("stopped")
            self._restart_exited(fleet)
            injector.tick(now, faulting=faults_over is None)
            if faults_from is None and ledger.deliveries():
                faults_from = now
            if faults_from is not None and faults_over is None:
                while events and events[0].at_s <= now - faults_from:
                    injector.apply(events.popleft(), now)
            if now >= self.progress_at:
                self.terminal = collect.terminal_counts(self.firestore, collection) or self.terminal
                self.published = feeder.published()
                self._progress(now, ledger, injector, fleet)
                self.progress_at = now + PROGRESS_EVERY_S
            done = sum(self.terminal) >= options.jobs
            if faults_from is not None and options.fault_time_s is not None:
                fault_until = min(fault_until, faults_from + options.fault_time_s)
            over_time = (
                now >= hard_stop
                or now >= fault_until + FIRST_ROUND_GRACE_S
                or (now >= fault_until and not injector.first_round_waiting)
            )
            if faults_over is None and (done or over_time):
                # No new fault; those in effect run their course (a partition cut short
                # would end before the job it holds changes hands), unless work is done.
                faults_over = now
                if done:
                    injector.heal_all(now)
                self._say(f"\n[{now:5.0f}s] fault phase over ({'work done' if done else 'time'})")
            if (
                faults_over is not None
                and done
                and not injector.pending
                and not ledger.unacked(set(feeder.published()))
            ):
                drained = now
                break
            if now >= options.time_limit_s:
                injector.heal_all(now)
                self._say(f"\n[{now:5.0f}s] time limit reached: stopping the fleet")
                break
            time.sleep(0.1)
        self._progress(self._now(), ledger, injector, fleet, final=True)
        return {
            "faults_from_s": faults_from,
            "faults_over_s": faults_over,
            "drained_s": drained,
            "stopped_s": self._now(),
            "unexpected_exits": self.unexpected_exits,
        }

    def _restart_exited(self, fleet: Fleet) -> None:
        """Start again a worker that exited by itself (not killed by the run); say so."""
        for worker in fleet.workers:
            code = worker.reap()
            if code is None:
                continue
            self.unexpected_exits += 1
            self._say(f"\n{worker.name} exited by itself ({code}):\n{worker.log_tail()}")
            if self.unexpected_exits > MAX_UNEXPECTED_EXITS:
                raise RunAborted(f"workers exited by themselves {self.unexpected_exits} times")
            worker.start()

    # -- reading back -----------------------------------------------------------------

    def _report(
        self,
        names: dict[str, str],
        phases: dict[str, Any],
        ledger: Ledger,
        injector: Injector,
        fleet: Fleet,
        outputs: KeyedConsumer,
        failures: KeyedConsumer,
        left: list[str],
        logs: Path,
    ) -> dict[str, Any]:
        docs = collect.job_documents(self.firestore, names["collection"], names["subscription"])
        writes = collect.business_writes(self.firestore, names["sink"])
        effects = collect.effect_lines(logs / "effects.jsonl")
        begins = [
            (str(e["job"]), int(e["pid"]), float(e["t"])) for e in effects if e["effect"] == "begin"
        ]
        plain = Counter(str(e["job"]) for e in effects if e["effect"] == "prepare")
        copies, output_jobs, unkeyed = outputs.snapshot()
        failure_copies, _, _ = failures.snapshot()
        evidence = Evidence(
            poison={key: bool(spec["poison"]) for key, spec in self.specs.items()},
            docs=docs,
            business_writes=writes,
            outputs=copies,
            output_jobs=output_jobs,
            failure_messages=failure_copies,
            plain_effects=plain,
            begins=begins,
            left_unacked=left,
            timed_out=phases["drained_s"] is None,
            kills=injector.kills,
        )
        checks, figures = verify(evidence)
        message_of = {key: message_id for message_id, key in self.published.items()}
        for recovery in figures["recoveries"]:
            # When Pub/Sub handed each held job out again: the first step of a recovery.
            recovery["redelivered_after_s"] = {
                job: [
                    f"{t - recovery['at_wall']:.1f} {worker}"
                    for t, worker in ledger.delivered_at(message_of.get(job, ""))
                    if t > recovery["at_wall"]
                ]
                for job in recovery["jobs"]
            }
        deliveries = ledger.deliveries()
        workers = collect.worker_counters(fleet)
        handovers = collect.handovers(
            begins, message_of, ledger, fleet.names(), since=self.started_wall
        )
        events = {
            **{fault.value: injector.counts.get(fault.value, 0) for fault in Fault},
            "skipped": dict(injector.skipped),
            "errors_injected": {
                method.rsplit("/", 1)[-1]: count
                for method, count in injector.pubsub_injected().items()
            },
            "deliveries": sum(deliveries.values()),
            "redeliveries": sum(n - 1 for n in deliveries.values() if n > 1),
            "redelivered_messages": sum(1 for n in deliveries.values() if n > 1),
            "pubsub": ledger.counts(),
            # Deliveries the wrapper was handed, beyond one per job. Most redeliveries by
            # Pub/Sub never get this far: the emulator hands a stream more than its flow
            # control asks for, and what waits there too long is given to another.
            "wrapper_redeliveries": max(
                int(workers["metrics"].get("received", 0)) - len(self.specs), 0
            ),
            "lost_ownership": int(workers["metrics"].get("lost_ownership", 0)),
            "stale_commits_rejected": int(workers["store"].get("commits_rejected", 0)),
            "claims_raced": int(workers["store"].get("claims_raced", 0)),
            "acks_lost": int(workers["metrics"].get("acks_lost", 0)),
            "worker_incarnations": sum(w.incarnation for w in fleet.workers),
            "unkeyed_outputs": unkeyed,
            "log_levels": collect.log_levels(fleet),
        }
        return {
            "seed": self.options.seed,
            "command": self.options.command,
            "ok": all(check.ok for check in checks),
            "options": self.options.as_json(),
            "subscription": {
                "path": names["subscription"],
                "exactly_once": True,
                "ack_deadline_s": self.options.lease_s,
                "retry_policy": None,
                "why": SUBSCRIPTION_NOTE,
            },
            "phases": phases,
            "checks": [asdict(check) for check in checks],
            "figures": figures,
            "events": events,
            "worker_metrics": workers,
            "timeline": injector.timeline,
            "handovers": handovers,
            "logs": str(logs) if self.options.log_dir else None,
        }

    # -- output -----------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _progress(
        self, now: float, ledger: Ledger, injector: Injector, fleet: Fleet, *, final: bool = False
    ) -> None:
        line = progress_line(
            now,
            jobs=self.options.jobs,
            terminal=self.terminal,
            acked=len(ledger.acked() & set(self.published)),
            redelivered=sum(1 for n in ledger.deliveries().values() if n > 1),
            faults=injector.counts,
            up=sum(1 for w in fleet.workers if w.up and not w.paused),
            workers=len(fleet.workers),
        )
        if self.options.live and not final:
            print("\r" + line.ljust(150)[:150], end="", file=self.out, flush=True)
        elif final or int(now) % 10 < PROGRESS_EVERY_S:
            print(line, file=self.out, flush=True)


def run_chaos(
    options: Options, *, emulators: Any = None, out: Output = sys.stderr
) -> dict[str, Any]:
    """Run one seed; start (and stop) the emulators unless ``emulators`` is given.

    The given emulators' variables must be in ``os.environ`` (``export_env()``):
    the orchestrator's own clients read them.

    Returns the report (see :mod:`benchmarks.chaos.report`); ``report["ok"]``
    says whether every invariant held.
    """
    with contextlib.ExitStack() as stack:
        if emulators is None:
            from emulator import start_emulators  # noqa: PLC0415

            emulators = stack.enter_context(start_emulators(project=PROJECT))
            emulators.export_env()
        return _Run(options, emulators, out).execute()
    raise AssertionError("unreachable")  # pragma: no cover
