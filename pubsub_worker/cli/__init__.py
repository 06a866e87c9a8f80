"""The ``pubsub-worker`` command: run a worker, check its configuration, inspect and fix jobs.

::

    pubsub-worker run package.module:handler      consume PUBSUB_WORKER_SUBSCRIPTION
        [--metrics-port N] [--processes N]        Prometheus + health; N worker processes
    pubsub-worker push package.module:handler     serve a push subscription's requests
        [--host H] [--port N] [--metrics-port N]  POST /, /livez, /readyz (uvicorn)
    pubsub-worker config [--json]                  the effective settings, checked live
    pubsub-worker jobs show KEY [--json]           one job: status, owner, lease, steps, outbox
    pubsub-worker jobs list [--status S] [--older-than 10m] [--limit N] [--after CURSOR]
    pubsub-worker jobs release KEY [--epoch N]     drop a stuck owner's claim (fenced)
    pubsub-worker jobs replay KEY... | --all-failed [--dry-run]
    pubsub-worker failed [--json]                  (as before) list failed jobs
    pubsub-worker replay --all | --key KEY ...     (as before) = jobs replay

Settings come from ``PUBSUB_WORKER_*`` variables (on Cloud Run the shutdown
grace defaults to 5 s, see :mod:`pubsub_worker._ops.config_report`). A
configuration or connection problem prints one clear line and exits 2 (no
traceback); ``config`` instead lists every problem and exits 1 if there is
any. ``replay`` prints one line per job (``replayed``, ``dry-run``,
``skipped: <why>`` or ``failed: <why>``, see :mod:`pubsub_worker._ops.replay`)
and a summary, and exits 1 unless every job listed was replayed. Keys are
shown through :func:`pubsub_worker._support.logs.printable`: a key cannot forge a
line or send terminal escapes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pubsub_worker._support.logs import configure
from pubsub_worker._worker.serve import DEFAULT_HOST
from pubsub_worker.errors import ConfigError, PubSubWorkerError, Unreachable
from pubsub_worker.stores.base import Status

from .config import cmd_config
from .environment import settings_from_env
from .jobs import (
    PAGE,
    cmd_backfill_shards,
    cmd_failed,
    cmd_jobs_replay,
    cmd_list,
    cmd_release,
    cmd_replay,
    cmd_show,
    parse_duration,
)
from .push import cmd_push, default_port
from .run import cmd_run
from .ui import add_ui_parser, cmd_ui

__all__ = ["build_parser", "main"]


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

    push_p = sub.add_parser("push", help="serve a push subscription's requests with a handler")
    push_p.add_argument("handler", help="package.module:function, taking (message, job)")
    push_p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST})"
    )
    push_p.add_argument(
        "--port",
        type=int,
        default=default_port(),
        metavar="N",
        help="port to serve on (default $PORT, else 8080)",
    )
    push_p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve /metrics (Prometheus), /livez and /readyz on this port too",
    )
    push_p.add_argument(
        "--metrics-host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST})"
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
    list_p.add_argument("--limit", type=int, default=PAGE, choices=range(1, 1001), metavar="N")
    list_p.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    list_p.add_argument("--json", action="store_true", help="machine-readable output")
    release_p = jobs_sub.add_parser("release", help="drop a stuck owner's claim (new epoch)")
    release_p.add_argument("key")
    release_p.add_argument(
        "--epoch", type=int, help="release only if the job is still at this epoch"
    )
    jobs_sub.add_parser(
        "backfill-shards",
        help="give documents written before the shard field their shard (once, after upgrading)",
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
    add_ui_parser(sub)
    return parser


_COMMANDS = {
    "run": cmd_run,
    "push": cmd_push,
    "ui": cmd_ui,
    "failed": cmd_failed,
    "replay": cmd_replay,
    ("jobs", "show"): cmd_show,
    ("jobs", "list"): cmd_list,
    ("jobs", "release"): cmd_release,
    ("jobs", "replay"): cmd_jobs_replay,
    ("jobs", "backfill-shards"): cmd_backfill_shards,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pubsub-worker`` command."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "config":
            return cmd_config(args)
        settings = settings_from_env()
        if args.command in ("run", "push"):
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
