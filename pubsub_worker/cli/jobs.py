"""``pubsub-worker jobs``: show, list, release and replay jobs; ``failed`` and ``replay`` too.

``jobs show``, ``jobs list`` and ``jobs release`` go through
:mod:`pubsub_worker._ops.jobs` and print through :mod:`pubsub_worker._ops.jobs_view`.
``jobs replay`` (and the older ``failed`` and ``replay``) go through
:mod:`pubsub_worker._ops.replay`: one line per job (``replayed``, ``dry-run``,
``skipped: <why>`` or ``failed: <why>``) and a summary, exit 1 unless
every job listed was replayed; from ten jobs on, a terminal shows a
progress bar.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops.jobs_view import lease_text, render_job, render_table
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, ReplayResult, list_failed, replay
from pubsub_worker._support import clients
from pubsub_worker._support.logs import printable
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import Status

from . import environment

__all__ = [
    "PAGE",
    "cmd_failed",
    "cmd_jobs_replay",
    "cmd_list",
    "cmd_release",
    "cmd_replay",
    "cmd_show",
    "parse_duration",
]

_BAR_FROM = 10
"""Replays of at least this many jobs show a progress bar on a terminal."""
PAGE = 50
"""Rows per page of ``jobs list`` unless ``--limit`` says otherwise."""


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """``jobs show KEY``: one job as text or JSON; 1 when there is none."""
    view = job_ops.show(environment.job_store(settings), settings.subscription_path, args.key)
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


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """``jobs list``: a page of the subscription's jobs, newest first, and how to get the next."""
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
        if args.limit != PAGE:
            again += ["--limit", str(args.limit)]
        print(f"next page: pubsub-worker {' '.join(again)} --after {page.next}")
    return 0


def cmd_release(args: argparse.Namespace, settings: Settings) -> int:
    """``jobs release KEY``: drop a stuck owner's claim, fenced; say what that did."""
    result = job_ops.release(
        environment.job_store(settings),
        settings.subscription_path,
        args.key,
        expect_epoch=args.epoch,
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
        f"  its lease: {lease_text(before)} (Firestore's clock); steps kept: {steps}; "
        f"attempts stay {before.attempts}"
    )
    print(
        "  its message comes back once its Pub/Sub lease ends (at most "
        f"{settings.lease_seconds} s after the owner's last extension); that delivery "
        "claims the job at a new epoch and skips the kept steps"
    )
    return 0


def cmd_backfill_shards(args: argparse.Namespace, settings: Settings) -> int:
    """``jobs backfill-shards``: give documents written before the shard field theirs (once)."""
    store = environment.job_store(settings)
    done = job_ops.backfill_shards(
        store.client, store, store.collection, settings.subscription_path
    )
    gone = f"; {done.vanished} deleted meanwhile" if done.vanished else ""
    print(
        f"{done.written} of {done.scanned} document(s) of {settings.subscription_path} "
        f"given their shard{gone}"
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


def cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    """``failed``: the failed jobs of the subscription, one line each or as JSON."""
    store = environment.job_store(settings)
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
    store = environment.job_store(settings)
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


def cmd_jobs_replay(args: argparse.Namespace, settings: Settings) -> int:
    """``jobs replay KEY... | --all-failed``: republish failed jobs."""
    if bool(args.all_failed) == bool(args.keys):
        raise ConfigError("jobs replay: give job keys or --all-failed (not both)")
    return _replay(settings, args.keys or (), topic=args.topic, dry_run=args.dry_run)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """``replay --all | --key KEY ...``: the older spelling of ``jobs replay``."""
    if not args.all and not args.key:
        raise ConfigError("replay: give --all or at least one --key")
    return _replay(settings, args.key or (), topic=args.topic, dry_run=args.dry_run)
