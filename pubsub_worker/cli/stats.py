"""``pubsub-worker jobs stats``: how many jobs of the subscription are in each status, and more.

What it reads, and what that costs, is :mod:`pubsub_worker._ops.stats`
(aggregation counts on the listing indexes, never a scan). Piped, it prints::

    STATUS     JOBS
    running       2
    released      0
    completed   120
    failed        3
    total       125
    oldest running: o-1004, last written 754 s ago (lease lapsed 604 s ago; owner h/12/ab)
    stuck: 1 running job(s) with no write for over a lease (150 s)
    pending reviews: 1 (failure message not published yet), of the 3 failed job(s)

On a terminal the counts are a table with each status in its colour;
``--output json`` gives :meth:`~pubsub_worker._ops.stats.JobStats.to_json`.
"""

from __future__ import annotations

import argparse
from typing import Any

from pubsub_worker._ops.jobs_view import lease_text
from pubsub_worker._ops.stats import FirestoreJobIndex, JobStats, job_stats
from pubsub_worker._support.logs import printable
from pubsub_worker.stores.base import Status

from . import environment
from .exit_codes import ExitCode
from .output import STATUS_STYLES, Column, Output

__all__ = ["cmd_stats", "register", "render_lines"]

_COLUMNS = (Column("STATUS", style=STATUS_STYLES.get), Column("JOBS", right=True))


def register(commands: Any) -> None:
    """Add ``stats`` to the subparsers of ``jobs``."""
    parser = commands.add_parser(
        "stats", help="jobs per status, the oldest running one, pending reviews"
    )
    environment.add_operator_options(parser)
    parser.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace, out: Output) -> int:
    """``jobs stats``: the counts as a table (or JSON), then the oldest running job and reviews."""
    settings = environment.settings_from(args)
    store = environment.job_store(settings)
    stats = job_stats(
        FirestoreJobIndex(store.client, store.collection, settings.subscription_path),
        stuck_after_s=float(settings.lease_seconds),
    )
    if args.output == "json":
        out.document(stats.to_json())
        return ExitCode.OK
    rows = [(status.value, str(n)) for status, n in stats.counts.items()]
    out.table(_COLUMNS, [*rows, ("total", str(stats.total))])
    for line in render_lines(stats):
        out.line(line)
    return ExitCode.OK


def render_lines(stats: JobStats) -> list[str]:
    """The lines under the counts: the oldest running job, the stuck, the pending reviews."""
    oldest = stats.oldest_running
    if oldest is None:
        first = "oldest running: none"
    else:
        key = printable(oldest.key) if oldest.key is not None else oldest.doc_id
        age = (
            f"{(stats.at - oldest.updated_at).total_seconds():.0f} s ago"
            if oldest.updated_at is not None
            else "at an unknown time"
        )
        first = (
            f"oldest running: {key}, last written {age} (lease {lease_text(oldest)}; "
            f"owner {printable(oldest.owner or '-')})"
        )
    failed = stats.counts[Status.FAILED]
    read = "" if stats.reviews_read >= failed else f" (read: the {stats.reviews_read} newest)"
    second = (
        f"pending reviews: {stats.reviews_pending} (failure message not published yet), "
        f"of the {failed} failed job(s){read}"
    )
    if stats.stuck is None:
        return [first, second]
    stuck = (
        f"stuck: {stats.stuck} running job(s) with no write for over a lease "
        f"({stats.stuck_after_s:g} s)"
    )
    return [first, stuck, second]
