"""The ``pubsub-worker`` command: run a worker, check its configuration, inspect and fix jobs.

::

    pubsub-worker run package.module:handler      consume PUBSUB_WORKER_SUBSCRIPTION
        [--metrics-port N] [--processes N]        Prometheus + health; N worker processes
    pubsub-worker config [--json]                  the effective settings, checked live
    pubsub-worker jobs show KEY [--json]           one job: status, owner, lease, steps, outbox
    pubsub-worker jobs list [--status S] [--older-than 10m] [--limit N] [--after CURSOR]
    pubsub-worker jobs release KEY [--epoch N]     drop a stuck owner's claim (fenced)
    pubsub-worker jobs replay KEY... | --all-failed [--dry-run]
    pubsub-worker failed [--json]                  (as before) list failed jobs
    pubsub-worker replay --all | --key KEY ...     (as before) = jobs replay

Settings come from ``PUBSUB_WORKER_*`` variables (on Cloud Run the shutdown
grace defaults to 5 s, see :mod:`pubsub_worker.config_check`). A
configuration or connection problem prints one clear line and exits 2 (no
traceback); ``config`` instead lists every problem and exits 1 if there is
any. ``replay`` prints one line per job (``replayed``, ``dry-run``,
``skipped: <why>`` or ``failed: <why>``, see :mod:`pubsub_worker.replay`)
and a summary, and exits 1 unless every job listed was replayed. Keys are
shown through :func:`pubsub_worker.logs.printable`: a key cannot forge a
line or send terminal escapes.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO, cast

from . import clients
from . import jobs as job_ops
from .config_check import (
    Check,
    Level,
    cloud_run,
    effective_settings,
    platform_overrides,
    run_checks,
)
from .errors import ConfigError, PubSubWorkerError, Unreachable
from .logs import configure, printable
from .replay import FailedJob, ReplayOutcome, ReplayResult, list_failed, replay
from .runner import run, supervise
from .serve import DEFAULT_HOST
from .settings import Settings
from .store import Status
from .stores import FirestoreJobStore

__all__ = ["build_parser", "main"]

_LOGGER = logging.getLogger("pubsub_worker")

_BAR_FROM = 10
"""Replays of at least this many jobs show a progress bar on a terminal."""
_STOP_MARGIN_S = 15.0
"""What a supervised process gets past its grace period before it is killed."""
_PAGE = 50
"""Rows per page of ``jobs list`` unless ``--limit`` says otherwise."""
_SHOWN = 2048
"""Bytes of an error or other long text ``jobs show`` prints."""


def _load_handler(spec: str) -> Any:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"handler {spec!r}: expected 'package.module:function'")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(f"handler {spec!r}: {module_name} has no {attribute!r}") from exc


def _settings() -> Settings:
    """Settings from the environment, with the platform's defaults (Cloud Run's grace)."""
    return Settings.from_env(**platform_overrides(os.environ))


# -- run -----------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    if platform_overrides(os.environ):
        _LOGGER.info(
            "on Cloud Run (%s is set): shutdown grace %.0f s, to fit its 10 s SIGTERM window "
            "(PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS overrides it)",
            cloud_run(os.environ),
            settings.shutdown_grace_seconds,
        )
    if args.metrics_port is not None and importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'pubsub-worker[prometheus]'"
        )
    if args.processes > 1:
        return _run_processes(args, settings)
    handler = _load_handler(args.handler)
    code = run(
        handler, settings=settings, metrics_port=args.metrics_port, metrics_host=args.metrics_host
    )
    stuck = [
        t for t in threading.enumerate() if t.name.startswith("pubsub-worker") and t.is_alive()
    ]
    stuck = [t for t in stuck if t.name != "pubsub-worker-metrics"]
    if stuck:  # a job blocked in user code: its job was released; do not hang the exit
        _LOGGER.warning("%d callback thread(s) still blocked; exiting anyway", len(stuck))
        logging.shutdown()
        os._exit(code)
    return code


def _run_processes(args: argparse.Namespace, settings: Settings) -> int:
    """``--processes N``: N copies of this command without it, supervised."""
    commands = []
    for index in range(args.processes):
        command = [sys.executable, "-m", "pubsub_worker.cli", "run", args.handler]
        if args.metrics_port is not None:
            # One endpoint per process: process i serves on PORT + i.
            port = args.metrics_port + index if args.metrics_port else 0
            command += ["--metrics-port", str(port), "--metrics-host", args.metrics_host]
        commands.append(command)
    return supervise(commands, stop_timeout_s=settings.shutdown_grace_seconds + _STOP_MARGIN_S)


# -- config --------------------------------------------------------------------------


def _cmd_config(args: argparse.Namespace) -> int:
    try:
        overrides = platform_overrides(os.environ)
        settings = Settings.from_env(**overrides)
    except ConfigError as exc:
        checks = [Check("settings", Level.PROBLEM, str(exc))]
        return _print_config(args, [], checks)
    rows = effective_settings(settings, os.environ, overrides)
    subscriber = clients.subscriber_client(settings)
    publisher = clients.publisher_client(settings)
    firestore_client = clients.firestore_client(settings)
    admin = None if settings.firestore_emulator_host else _admin_client
    try:
        checks = run_checks(
            settings,
            subscriber=subscriber,
            publisher=publisher,
            firestore_client=firestore_client,
            admin=admin,
        )
    finally:
        # The clients' close methods are untyped; they only release channels here.
        for client in (subscriber, cast(Any, publisher).transport, firestore_client):
            cast(Any, client).close()
    return _print_config(args, rows, checks, settings=settings)


def _admin_client() -> Any:
    from google.cloud import firestore_admin_v1  # noqa: PLC0415 - real Firestore only

    return firestore_admin_v1.FirestoreAdminClient()


def _print_config(
    args: argparse.Namespace,
    rows: list[Any],
    checks: list[Check],
    *,
    settings: Settings | None = None,
) -> int:
    problems = [c for c in checks if c.level is Level.PROBLEM]
    if args.json:
        document = {
            "settings": [
                {"variable": r.variable, "value": r.value, "source": r.source} for r in rows
            ],
            "checks": [c.to_json() for c in checks],
            "problems": len(problems),
        }
        print(json.dumps(document, indent=2, ensure_ascii=True))
        return 1 if problems else 0
    if rows:
        print("configuration")
        width = max(len(r.variable) for r in rows)
        for row in rows:
            print(f"  {row.variable:<{width}}  {printable(row.value, None)}  ({row.source})")
        print()
    where = f" of {settings.subscription_path}" if settings and settings.subscription else ""
    print(f"checks{where}")
    for check in checks:
        print(f"  {check.level.value.upper():<8} {check.name}: {printable(check.detail, None)}")
    print()
    if problems:
        print(f"{len(problems)} problem(s):")
        for check in problems:
            print(f"  - {check.name}: {printable(check.detail, None)}")
        return 1
    warnings = sum(1 for c in checks if c.level is Level.WARNING)
    print(f"no problems ({warnings} warning(s))")
    return 0


# -- jobs ----------------------------------------------------------------------------


def _store(settings: Settings) -> FirestoreJobStore:
    """The job store the commands read and write (one write at a time: no batching needed)."""
    return FirestoreJobStore(clients.firestore_client(settings), settings.collection)


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "-"


def _lease(view: job_ops.JobView) -> str:
    if view.lease_left_s is None:
        return "-"
    if view.lease_left_s > 0:
        return f"{view.lease_left_s:.0f} s left"
    return f"lapsed {-view.lease_left_s:.0f} s ago"


def _size(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"


def render_job(view: job_ops.JobView) -> str:
    """``jobs show`` as text: one fact per line, every stored string shown escaped."""
    key = printable(view.key, None) if view.key is not None else "(no key)"
    owner_label = "owner" if view.status is Status.RUNNING else "last owner"
    lines = [
        f"job {key}",
        f"  status       {view.status.value} (epoch {view.epoch}, attempts {view.attempts})",
        f"  {owner_label:<12} {printable(view.owner or '-')} "
        f"(message {printable(view.message_id or '-')})",
    ]
    if view.lease_left_s is not None:
        of = f" of {view.lease_s:.0f} s" if view.lease_s else ""
        lines.append(f"  lease        {_lease(view)}{of} (Firestore's clock)")
    if view.reason:
        lines.append(f"  reason       {printable(view.reason)}")
    lines += [
        f"  first seen   {_when(view.first_seen_at)}",
        f"  updated      {_when(view.updated_at)}",
    ]
    for label, value in (
        ("completed", view.completed_at),
        ("failed", view.failed_at),
        ("replayed", view.replayed_at),
    ):
        if value is not None:
            lines.append(f"  {label:<12} {_when(value)}")
    lines.append(f"  expires      {_when(view.expire_at)}")
    lines.append(f"  document     {view.doc_id}")
    lines.append(f"  steps        {len(view.steps)}" + (":" if view.steps else ""))
    width = max((len(printable(step.name)) for step in view.steps), default=0)
    for step in view.steps:
        lines.append(
            f"    {printable(step.name):<{width}}  epoch {step.epoch}  {_when(step.at)}  "
            f"{_size(step.size_bytes)}"
        )
    lines.append(f"  outbox       {len(view.outbox)}" + (":" if view.outbox else ""))
    for entry in view.outbox:
        lines.append(
            f"    {printable(entry.id)}  step {printable(entry.step)}  -> "
            f"{printable(entry.topic)}  {_size(entry.size_bytes)}  "
            + ("sent" if entry.sent else "NOT SENT")
        )
    lines.append(
        f"  last error   {printable(view.error, _SHOWN)}" if view.error else "  last error   -"
    )
    return "\n".join(lines)


def render_table(views: Sequence[job_ops.JobView]) -> str:
    """``jobs list`` as an aligned table, newest first; keys and errors escaped and clipped."""
    header = ("KEY", "STATUS", "EPOCH", "ATTEMPTS", "UPDATED", "LEASE", "STEPS", "ERROR")
    rows = [header] + [
        (
            printable(view.key, 40) if view.key is not None else "(no key)",
            view.status.value,
            str(view.epoch),
            str(view.attempts),
            _when(view.updated_at),
            _lease(view),
            str(len(view.steps)),
            printable(view.error, 60) if view.error else "",
        )
        for view in views
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = (
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        + "  "
        + row[-1]
        for row in rows
    )
    return "\n".join(line.rstrip() for line in lines)


def _cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    view = job_ops.show(_store(settings), settings.subscription_path, args.key)
    if view is None:
        print(
            f"pubsub-worker: no job {printable(args.key)} on {settings.subscription_path}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(view.to_json(), indent=2, ensure_ascii=True))
    else:
        print(render_job(view))
    return 0


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``30s``, ``10m``, ``1h30m``, ``2d`` in seconds; ``ArgumentTypeError`` otherwise."""
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration like 90s, 10m, 1h30m")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    store = _store(settings)
    try:
        page = job_ops.list_jobs(
            store.client,
            store.collection,
            settings.subscription_path,
            status=Status(args.status) if args.status else None,
            older_than_s=args.older_than,
            limit=args.limit,
            after=args.after,
        )
    except ValueError as exc:  # a malformed --after cursor
        raise ConfigError(f"--after: {exc}") from exc
    if args.json:
        document = {"jobs": [view.to_json() for view in page.jobs], "next": page.next}
        print(json.dumps(document, indent=2, ensure_ascii=True))
        return 0
    if page.jobs:
        print(render_table(page.jobs))
    filters = []
    if args.status:
        filters.append(f"status {args.status}")
    if args.older_than is not None:
        filters.append(f"last written over {args.older_than:.0f} s ago")
    what = f" ({', '.join(filters)})" if filters else ""
    print(f"{len(page.jobs)} job(s) on {settings.subscription_path}{what}, newest first")
    if page.next:
        again = ["jobs", "list"]
        if args.status:
            again += ["--status", args.status]
        if args.older_than is not None:
            again += ["--older-than", f"{args.older_than:g}s"]
        if args.limit != _PAGE:
            again += ["--limit", str(args.limit)]
        print(f"next page: pubsub-worker {' '.join(again)} --after {page.next}")
    return 0


def _cmd_release(args: argparse.Namespace, settings: Settings) -> int:
    result = job_ops.release(
        _store(settings), settings.subscription_path, args.key, expect_epoch=args.epoch
    )
    key = printable(args.key)
    if result.kind is not job_ops.ReleaseOutcome.RELEASED:
        stream = sys.stdout if result.ok else sys.stderr
        verb = "" if result.ok else "not released: "
        print(f"{'' if result.ok else 'pubsub-worker: '}{key}: {verb}{result.detail}", file=stream)
        return 0 if result.ok else 1
    before = result.before
    assert before is not None
    steps = ", ".join(printable(step.name) for step in before.steps) or "none"
    print(f"released {key}: epoch {before.epoch} -> {result.epoch}, status running -> released")
    print(
        f"  fenced owner {printable(before.owner or '-')} (message "
        f"{printable(before.message_id or '-')}): its next write is refused, so it stops "
        "without committing or acking"
    )
    print(
        f"  its lease: {_lease(before)} (Firestore's clock); steps kept: {steps}; "
        f"attempts stay {before.attempts}"
    )
    print(
        "  its message comes back once its Pub/Sub lease ends (at most "
        f"{settings.lease_seconds} s after the owner's last extension); that delivery "
        "claims the job at a new epoch and skips the kept steps"
    )
    return 0


# -- replay --------------------------------------------------------------------------


def _row(job: FailedJob) -> dict[str, Any]:
    record = job.record
    return {
        "key": record.key,
        "reason": record.reason,
        "attempts": record.attempts,
        "failed_at": record.failed_at.isoformat() if record.failed_at else None,
        "message_id": record.message_id,
        "error": record.error,
        "replayable": job.replayable,
    }


def _cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    store = _store(settings)
    jobs = list(list_failed(store.client, store.collection, settings.subscription_path))
    if args.json:
        print(json.dumps([_row(job) for job in jobs], indent=2, ensure_ascii=False))
        return 0
    for job in jobs:
        row = _row(job)
        print(
            f"{printable(str(row['key']), 40):40}  {row['reason']!s:16}  "
            f"attempts={row['attempts']}  {row['failed_at']}  {printable(str(row['error']), 80)}"
        )
    print(f"{len(jobs)} failed job(s) on {settings.subscription_path}")
    return 0


class _Bar:
    """A one-line progress bar on a terminal; notes are printed above it."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self._total = total
        self._stream = stream
        self._done = 0

    def update(self, done: int) -> None:
        self._done = done
        filled = round(30 * done / self._total)
        self._stream.write(f"\r\x1b[Kreplaying [{'#' * filled}{'.' * (30 - filled)}] ")
        self._stream.write(f"{done}/{self._total}")
        self._stream.flush()

    def note(self, line: str) -> None:
        self._stream.write("\r\x1b[K")
        self._stream.flush()
        print(line, flush=True)
        self.update(self._done)

    def close(self) -> None:
        self._stream.write("\r\x1b[K")
        self._stream.flush()


def _replay(settings: Settings, keys: Sequence[str], *, topic: str | None, dry_run: bool) -> int:
    store = _store(settings)
    jobs = list(list_failed(store.client, store.collection, settings.subscription_path, keys=keys))
    target = topic and settings.topic_path(topic)
    if not target:
        subscriber = clients.subscriber_client(settings)
        try:
            target = subscriber.get_subscription(
                request={"subscription": settings.subscription_path}
            ).topic
        finally:
            subscriber.close()
    publisher = clients.publisher_client(settings)
    publish = clients.publisher_function(publisher)
    total = len(jobs)
    interactive = sys.stdout.isatty() and sys.stderr.isatty()
    bar = _Bar(total, sys.stderr) if interactive and total >= _BAR_FROM else None

    def progress(index: int, result: ReplayResult) -> None:
        line = f"[{index}/{total}] {printable(result.job.key or result.job.doc_id)}: "
        line += printable(result.outcome, None)
        if bar is None:
            print(line, flush=True)
            return
        if result.kind not in (ReplayOutcome.REPLAYED, ReplayOutcome.DRY_RUN):
            bar.note(line)
        bar.update(index)

    try:
        results = replay(
            store,
            jobs,
            topic=target,
            publish=publish,
            key_attribute=settings.key_attribute,
            dry_run=dry_run,
            progress=progress,
            timeout_s=settings.ack_timeout_seconds,
        )
    finally:
        if bar is not None:
            bar.close()
    done = sum(1 for r in results if r.kind in (ReplayOutcome.REPLAYED, ReplayOutcome.DRY_RUN))
    print(f"replayed {done} of {total} job(s) to {target}")
    for line in _summary(results, dry_run=dry_run):
        print(line)
    return 0 if done == total else 1


def _summary(results: Sequence[ReplayResult], *, dry_run: bool) -> list[str]:
    """What the summary line does not say: how many were skipped or failed, and why."""
    lines = []
    if dry_run:
        lines.append("  dry run: nothing was written or published")
    for kind in (ReplayOutcome.SKIPPED, ReplayOutcome.FAILED):
        reasons = collections.Counter(
            re.split(r" \(|;", r.reason or "")[0] for r in results if r.kind is kind
        )
        if reasons:
            parts = ", ".join(f"{why} ({n})" for why, n in reasons.most_common())
            lines.append(f"  {kind.value} {sum(reasons.values())}: {printable(parts, None)}")
    return lines


def _cmd_jobs_replay(args: argparse.Namespace, settings: Settings) -> int:
    if bool(args.all_failed) == bool(args.keys):
        raise ConfigError("jobs replay: give job keys or --all-failed (not both)")
    return _replay(settings, args.keys or (), topic=args.topic, dry_run=args.dry_run)


def _cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    if not args.all and not args.key:
        raise ConfigError("replay: give --all or at least one --key")
    return _replay(settings, args.key or (), topic=args.topic, dry_run=args.dry_run)


# -- parser --------------------------------------------------------------------------


def _add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", help="topic to publish to (default: the subscription's)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be replayed")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="pubsub-worker", description="Exactly-once Pub/Sub worker (settings: PUBSUB_WORKER_*)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="consume the subscription with a handler")
    run_p.add_argument("handler", help="package.module:function, taking (message, job)")
    run_p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve /metrics (Prometheus), /livez and /readyz on this port (0: any free port)",
    )
    run_p.add_argument(
        "--metrics-host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST})"
    )
    run_p.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        choices=range(1, 65),
        help="run N worker processes (1 to 64) on the subscription, supervised",
    )

    config_p = sub.add_parser("config", help="the effective settings, checked against the cloud")
    config_p.add_argument("--json", action="store_true", help="machine-readable output")

    jobs_p = sub.add_parser("jobs", help="inspect, release and replay jobs")
    jobs_sub = jobs_p.add_subparsers(dest="jobs_command", required=True)
    show_p = jobs_sub.add_parser("show", help="one job: status, owner, lease, steps, outbox")
    show_p.add_argument("key", help="the job's key (its message id without KEY_ATTRIBUTE)")
    show_p.add_argument("--json", action="store_true", help="machine-readable output")
    list_p = jobs_sub.add_parser("list", help="jobs of the subscription, newest first, paged")
    list_p.add_argument("--status", choices=[s.value for s in Status])
    list_p.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="last written at least AGE ago (90s, 10m, 2h)",
    )
    list_p.add_argument("--limit", type=int, default=_PAGE, choices=range(1, 1001), metavar="N")
    list_p.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    list_p.add_argument("--json", action="store_true", help="machine-readable output")
    release_p = jobs_sub.add_parser("release", help="drop a stuck owner's claim (new epoch)")
    release_p.add_argument("key")
    release_p.add_argument(
        "--epoch", type=int, help="release only if the job is still at this epoch"
    )
    jreplay_p = jobs_sub.add_parser("replay", help="republish failed jobs; done steps are skipped")
    jreplay_p.add_argument("keys", nargs="*", metavar="KEY")
    jreplay_p.add_argument("--all-failed", action="store_true", help="every failed job")
    _add_replay_options(jreplay_p)

    failed_p = sub.add_parser("failed", help="list failed jobs awaiting review")
    failed_p.add_argument("--json", action="store_true", help="machine-readable output")
    replay_p = sub.add_parser("replay", help="republish failed jobs; completed steps are skipped")
    replay_p.add_argument("--all", action="store_true", help="every failed job")
    replay_p.add_argument("--key", action="append", help="a job key (repeatable)")
    _add_replay_options(replay_p)
    return parser


_COMMANDS = {
    "run": _cmd_run,
    "failed": _cmd_failed,
    "replay": _cmd_replay,
    ("jobs", "show"): _cmd_show,
    ("jobs", "list"): _cmd_list,
    ("jobs", "release"): _cmd_release,
    ("jobs", "replay"): _cmd_jobs_replay,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pubsub-worker`` command."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "config":
            return _cmd_config(args)
        settings = _settings()
        if args.command == "run":
            configure(settings.log_format)
            logging.getLogger("google").setLevel(logging.WARNING)
        name = (args.command, args.jobs_command) if args.command == "jobs" else args.command
        return _COMMANDS[name](args, settings)
    except (ConfigError, Unreachable) as exc:
        print(f"pubsub-worker: {exc}", file=sys.stderr)
        return 2
    except PubSubWorkerError as exc:
        print(f"pubsub-worker: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
