"""``pubsub-worker jobs``: show, list, release, replay and count the jobs of a subscription.

``jobs show``, ``jobs list`` and ``jobs release`` go through
:mod:`pubsub_worker._ops.jobs` and are here; ``jobs replay`` is
:mod:`pubsub_worker.cli.replay` and ``jobs stats``
:mod:`pubsub_worker.cli.stats`. Each takes ``--subscription``, ``--project``
and ``--output json`` (:func:`~pubsub_worker.cli.environment.add_operator_options`).
A key that no job has is one line and exit 4.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops.jobs_view import LIST_HEADER, lease_text, list_row, render_job
from pubsub_worker._support.logs import printable
from pubsub_worker.errors import ConfigError
from pubsub_worker.stores.base import Status

from . import environment, replay, stats
from .environment import add_operator_options
from .exit_codes import ExitCode
from .output import STATUS_STYLES, Column, Output

__all__ = [
    "PAGE",
    "cmd_list",
    "cmd_release",
    "cmd_show",
    "parse_duration",
    "register",
]

PAGE = 50
"""Rows per page of ``jobs list`` unless ``--limit`` says otherwise."""

_LIST_COLUMNS = tuple(
    Column(
        header,
        right=header in ("EPOCH", "ATTEMPTS", "STEPS"),
        style=STATUS_STYLES.get if header == "STATUS" else None,
    )
    for header in LIST_HEADER
)


def register(commands: Any) -> None:
    """Add ``jobs`` and its subcommands to the command's subparsers."""
    jobs = commands.add_parser("jobs", help="inspect, count, release and replay jobs")
    sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")

    show = sub.add_parser("show", help="one job: status, owner, lease, steps, outbox")
    show.add_argument("key", help="the job's key (its message id without KEY_ATTRIBUTE)")
    add_operator_options(show)
    show.set_defaults(func=cmd_show)

    listing = sub.add_parser("list", help="jobs of the subscription, newest first, paged")
    listing.add_argument("--status", choices=[s.value for s in Status])
    listing.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="last written at least AGE ago (90s, 10m, 2h)",
    )
    listing.add_argument("--limit", type=int, default=PAGE, choices=range(1, 1001), metavar="N")
    listing.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    add_operator_options(listing)
    listing.set_defaults(func=cmd_list)

    stats.register(sub)

    release = sub.add_parser("release", help="drop a stuck owner's claim (new epoch)")
    release.add_argument("key")
    release.add_argument("--epoch", type=int, help="release only if the job is still at this epoch")
    add_operator_options(release)
    release.set_defaults(func=cmd_release)

    replay.register(sub)


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    """``jobs show KEY``: one job as text or JSON; exit 4 when there is none."""
    settings = environment.settings_from(args)
    view = job_ops.show(environment.job_store(settings), settings.subscription_path, args.key)
    if view is None:
        out.error(f"no job {printable(args.key)} on {settings.subscription_path}")
        return ExitCode.NOT_FOUND
    if args.output == "json":
        out.document(view.to_json())
    else:
        out.line(render_job(view))
    return ExitCode.OK


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


def cmd_list(args: argparse.Namespace, out: Output) -> int:
    """``jobs list``: a page of the subscription's jobs, newest first, and how to get the next."""
    settings = environment.settings_from(args)
    store = environment.job_store(settings)
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
    if args.output == "json":
        out.document({"jobs": [view.to_json() for view in page.jobs], "next": page.next})
        return ExitCode.OK
    if page.jobs:
        out.table(_LIST_COLUMNS, [list_row(view) for view in page.jobs])
    filters = []
    if args.status:
        filters.append(f"status {args.status}")
    if args.older_than is not None:
        filters.append(f"last written over {args.older_than:.0f} s ago")
    what = f" ({', '.join(filters)})" if filters else ""
    out.line(f"{len(page.jobs)} job(s) on {settings.subscription_path}{what}, newest first")
    if page.next:
        again = ["jobs", "list"]
        if args.status:
            again += ["--status", args.status]
        if args.older_than is not None:
            again += ["--older-than", f"{args.older_than:g}s"]
        if args.limit != PAGE:
            again += ["--limit", str(args.limit)]
        out.line(f"next page: pubsub-worker {' '.join(again)} --after {page.next}")
    return ExitCode.OK


def cmd_release(args: argparse.Namespace, out: Output) -> int:
    """``jobs release KEY``: drop a stuck owner's claim, fenced; say what that did."""
    settings = environment.settings_from(args)
    result = job_ops.release(
        environment.job_store(settings),
        settings.subscription_path,
        args.key,
        expect_epoch=args.epoch,
    )
    code = ExitCode.OK if result.ok else ExitCode.FAILED
    if result.kind is job_ops.ReleaseOutcome.NOT_FOUND:
        code = ExitCode.NOT_FOUND
    key = printable(args.key)
    before = result.before
    if args.output == "json":
        out.document(
            {
                "key": args.key,
                "outcome": result.kind.value,
                "released": result.ok,
                "detail": result.detail or None,
                "epoch_before": before.epoch if before is not None else None,
                "epoch": result.epoch,
            }
        )
        return code
    if result.kind is not job_ops.ReleaseOutcome.RELEASED:
        if result.ok:
            out.line(f"{key}: {result.detail}")
        else:
            out.error(f"{key}: not released: {result.detail}")
        return code
    assert before is not None
    steps = ", ".join(printable(step.name) for step in before.steps) or "none"
    out.line(f"released {key}: epoch {before.epoch} -> {result.epoch}, status running -> released")
    out.line(
        f"  fenced owner {printable(before.owner or '-')} (message "
        f"{printable(before.message_id or '-')}): its next write is refused, so it stops "
        "without committing or acking"
    )
    out.line(
        f"  its lease: {lease_text(before)} (Firestore's clock); steps kept: {steps}; "
        f"attempts stay {before.attempts}"
    )
    out.line(
        "  its message comes back once its Pub/Sub lease ends (at most "
        f"{settings.lease_seconds} s after the owner's last extension); that delivery "
        "claims the job at a new epoch and skips the kept steps"
    )
    return code
