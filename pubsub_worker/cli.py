"""The ``pubsub-worker`` command: run a worker, list the failure path, replay it.

::

    pubsub-worker run package.module:handler     consume PUBSUB_WORKER_SUBSCRIPTION
    pubsub-worker failed [--json]                 list failed jobs for review
    pubsub-worker replay --all | --key KEY ...    revive failed jobs (completed steps are skipped)

Settings come from ``PUBSUB_WORKER_*`` variables. A configuration or
connection problem prints one clear line and exits 2 (no traceback).
``replay`` prints one line per job (``replayed``, ``dry-run``, ``skipped:
<why>`` or ``failed: <why>``, see :mod:`pubsub_worker.replay`) and exits 1
unless every job listed was replayed; a job that changed meanwhile is one
such line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from . import clients
from .errors import ConfigError, PubSubWorkerError, Unreachable
from .logs import configure
from .replay import FailedJob, ReplayOutcome, ReplayResult, list_failed, replay
from .runner import run
from .settings import Settings
from .stores import FirestoreJobStore

__all__ = ["main"]

_LOGGER = logging.getLogger("pubsub_worker")


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


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    handler = _load_handler(args.handler)
    code = run(handler, settings=settings)
    stuck = [
        t for t in threading.enumerate() if t.name.startswith("pubsub-worker") and t.is_alive()
    ]
    if stuck:  # a job blocked in user code: its job was released; do not hang the exit
        _LOGGER.warning("%d callback thread(s) still blocked; exiting anyway", len(stuck))
        logging.shutdown()
        os._exit(code)
    return code


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


def _store(settings: Settings) -> FirestoreJobStore:
    """The job store the commands read and write (one write at a time: no batching needed)."""
    return FirestoreJobStore(clients.firestore_client(settings), settings.collection)


def _cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    store = _store(settings)
    jobs = list(list_failed(store.client, store.collection, settings.subscription_path))
    if args.json:
        print(json.dumps([_row(job) for job in jobs], indent=2, ensure_ascii=False))
        return 0
    for job in jobs:
        row = _row(job)
        print(
            f"{row['key']!s:40.40}  {row['reason']!s:16}  attempts={row['attempts']}  "
            f"{row['failed_at']}  {str(row['error'])[:80]}"
        )
    print(f"{len(jobs)} failed job(s) on {settings.subscription_path}")
    return 0


def _cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    if not args.all and not args.key:
        raise ConfigError("replay: give --all or at least one --key")
    store = _store(settings)
    jobs = list(
        list_failed(store.client, store.collection, settings.subscription_path, keys=args.key or ())
    )
    topic = args.topic and settings.topic_path(args.topic)
    if not topic:
        subscriber = clients.subscriber_client(settings)
        try:
            topic = subscriber.get_subscription(
                request={"subscription": settings.subscription_path}
            ).topic
        finally:
            subscriber.close()
    publisher = clients.publisher_client(settings)
    publish = clients.publisher_function(publisher)
    total = len(jobs)

    def progress(index: int, result: ReplayResult) -> None:
        print(f"[{index}/{total}] {result.job.key}: {result.outcome}", flush=True)

    results = replay(
        store,
        jobs,
        topic=topic,
        publish=publish,
        key_attribute=settings.key_attribute,
        dry_run=args.dry_run,
        progress=progress,
        timeout_s=settings.ack_timeout_seconds,
    )
    done = sum(1 for r in results if r.kind in (ReplayOutcome.REPLAYED, ReplayOutcome.DRY_RUN))
    print(f"replayed {done} of {total} job(s) to {topic}")
    return 0 if done == total else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="pubsub-worker", description="Exactly-once Pub/Sub worker (settings: PUBSUB_WORKER_*)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="consume the subscription with a handler")
    run_p.add_argument("handler", help="package.module:function, taking (message, job)")
    failed_p = sub.add_parser("failed", help="list failed jobs awaiting review")
    failed_p.add_argument("--json", action="store_true", help="machine-readable output")
    replay_p = sub.add_parser("replay", help="republish failed jobs; completed steps are skipped")
    replay_p.add_argument("--all", action="store_true", help="every failed job")
    replay_p.add_argument("--key", action="append", help="a job key (repeatable)")
    replay_p.add_argument("--topic", help="topic to publish to (default: the subscription's)")
    replay_p.add_argument("--dry-run", action="store_true", help="list what would be replayed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pubsub-worker`` command."""
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        if args.command == "run":
            configure(settings.log_format)
            logging.getLogger("google").setLevel(logging.WARNING)
        command = {"run": _cmd_run, "failed": _cmd_failed, "replay": _cmd_replay}[args.command]
        return command(args, settings)
    except (ConfigError, Unreachable) as exc:
        print(f"pubsub-worker: {exc}", file=sys.stderr)
        return 2
    except PubSubWorkerError as exc:
        print(f"pubsub-worker: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
