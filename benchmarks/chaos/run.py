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
import dataclasses
import functools
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from benchmarks.chaos import collect
from benchmarks.chaos.compare import LABELS
from benchmarks.chaos.downstream import KeyedConsumer
from benchmarks.chaos.feeder import KEY_ATTRIBUTE, Feeder, job_specs
from benchmarks.chaos.fleet import Fleet, worker_env
from benchmarks.chaos.injector import Injector
from benchmarks.chaos.ledger import Ledger
from benchmarks.chaos.options import Options
from benchmarks.chaos.parallel import Prefixed, run_threads
from benchmarks.chaos.report import progress_line
from benchmarks.chaos.schedule import build_schedule

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
        library = options.handler == "library"
        keep = options.log_dir is not None
        logs = options.log_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
        run_name = f"seed-{options.seed}" + ("" if library else f"-baseline-{options.handler}")
        logs = logs / run_name if keep else logs
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
                "markers": unique_id("chaos-markers"),
                "output_topic": outputs.topic_path,
                "failure_topic": failures.topic_path,
            }
            ledger = Ledger(jobs.subscription_path)
            fleet = Fleet(
                options.workers,
                pubsub_host=self.emulators.pubsub_host,
                firestore_host=self.emulators.firestore_host,
                env=worker_env(options, self.emulators.project, names, logs),
                log_dir=logs,
                seed=options.seed,
                observer=ledger.for_worker,
                handler=options.handler,
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
            store = f"store {options.store}" if library else "the stock client"
            self._say(
                f"chaos seed {options.seed}: {LABELS[options.handler]}, {options.label}, "
                f"lease {options.lease_s} s, {options.max_messages} in flight per worker, {store}"
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
            return collect.account(
                options,
                self.firestore,
                specs=self.specs,
                published=self.published,
                started_wall=self.started_wall,
                names=names,
                phases=phases,
                ledger=ledger,
                injector=injector,
                fleet=fleet,
                outputs=out_consumer,
                failures=fail_consumer,
                left=left,
                logs=logs,
                subscription_note=SUBSCRIPTION_NOTE,
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
                self.published = feeder.published()
                self.terminal = self._terminal(collection, ledger)
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

    def _terminal(self, collection: str, ledger: Ledger) -> tuple[int, int]:
        """``(done, failed)`` so far. The library's job documents say; the baseline keeps
        none, so its jobs count as done once acked (a skipped redelivery is acked too)."""
        if self.options.handler == "library":
            return collect.terminal_counts(self.firestore, collection) or self.terminal
        return len(ledger.acked() & set(self.published)), 0

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
    says whether every invariant held. With ``options.baseline``, each
    baseline variant runs on the same seed, after the library (at the same
    time with ``options.parallel``), ``report["baseline"]`` holds their
    reports (their ``ok`` is a measurement, not part of this one's) and
    ``report["comparison"]`` each run's counts by what it ran (the
    side-by-side table's columns).
    """
    with contextlib.ExitStack() as stack:
        if emulators is None:
            from emulator import start_emulators  # noqa: PLC0415

            emulators = stack.enter_context(start_emulators(project=PROJECT))
            emulators.export_env()
        if options.handler != "library" or not options.baseline:
            return _Run(options, emulators, out).execute()
        # The same seed: the same jobs and the same fault schedule.
        runs = [options, *(dataclasses.replace(options, handler=v) for v in options.baseline)]
        if options.parallel:
            runs = [dataclasses.replace(o, live=False) for o in runs]
            calls = [
                functools.partial(_execute, o, emulators, Prefixed(out, f"[{LABELS[o.handler]}] "))
                for o in runs
            ]
            names = [f"chaos-{o.seed}-{o.handler}" for o in runs]
            report, *baseline = run_threads(calls, names, STOP)
        else:
            report, *baseline = [_execute(o, emulators, out) for o in runs]
        report["baseline"] = baseline
        report["comparison"] = {r["handler"]: r["tally"] for r in (report, *baseline)}
        return report
    raise AssertionError("unreachable")  # pragma: no cover


def _execute(options: Options, emulators: Any, out: Output) -> dict[str, Any]:
    return _Run(options, emulators, out).execute()
