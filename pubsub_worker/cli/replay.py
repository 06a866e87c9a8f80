"""``pubsub-worker jobs replay KEY... | --all-failed``: republish failed jobs, skipping done steps.

What a replay does with each job is :mod:`pubsub_worker._ops.replay`. Given
keys, every key must name a job of the subscription: one that does not is
named on one line, nothing is replayed, and the command exits 4. Each job is
one line, ``[i/N] KEY: replayed`` (``would replay to TOPIC`` with
``--dry-run``, ``skipped: <why>``, ``failed: <why>``), then a summary:
``replayed N of M job(s) to TOPIC (reaches only SUBSCRIPTION)`` (``would
replay ...`` and ``dry run: nothing was written or published`` with
``--dry-run``) and the skipped and failed ones by reason.

Replays go to the subscription's replay topic, which only its own worker
reads (:mod:`pubsub_worker._ops.replay_route`; ``jobs replay-setup`` makes
it); without one the command refuses (exit 2) rather than reach every
subscription of the topic. ``--fan-out`` publishes to the subscription's
topic (every subscription of it gets the message), ``--topic T`` to T.
From ten jobs on, a terminal shows a progress bar instead and prints only the
jobs that were not replayed. Exit 1 unless every job was (or would be)
replayed. ``--output json`` prints one document at the end.
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Sequence
from typing import Any

from pubsub_worker._ops import replay_route
from pubsub_worker._ops.replay import (
    ReplayOutcome,
    ReplayResult,
    list_failed,
    replay,
    unknown_keys,
)
from pubsub_worker._support import clients
from pubsub_worker._support.logs import printable
from pubsub_worker.errors import ConfigError

from . import environment
from .exit_codes import ExitCode
from .output import Output

__all__ = ["cmd_replay", "cmd_replay_setup", "register", "summary"]

_DONE = (ReplayOutcome.REPLAYED, ReplayOutcome.DRY_RUN)


def register(commands: Any) -> None:
    """Add ``replay`` to the subparsers of ``jobs``."""
    parser = commands.add_parser("replay", help="republish failed jobs; done steps are skipped")
    parser.add_argument("keys", nargs="*", metavar="KEY")
    parser.add_argument("--all-failed", action="store_true", help="every failed job")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--fan-out",
        action="store_true",
        help="publish to the subscription's topic: EVERY subscription of it gets the message",
    )
    where.add_argument("--topic", help="publish to this topic (default: the replay topic)")
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be replayed; write nothing"
    )
    environment.add_operator_options(parser)
    parser.set_defaults(func=cmd_replay)
    setup = commands.add_parser(
        "replay-setup",
        help="make the replay topic and subscription, so replays reach this subscription only",
    )
    environment.add_operator_options(setup)
    setup.set_defaults(func=cmd_replay_setup)


def cmd_replay_setup(args: argparse.Namespace, out: Output) -> int:
    """``jobs replay-setup``: the replay topic and subscription (idempotent)."""
    settings = environment.settings_from(args)
    subscriber = clients.subscriber_client(settings)
    try:
        made = replay_route.setup(
            settings, subscriber=subscriber, publisher=clients.publisher_client(settings)
        )
    finally:
        subscriber.close()
    if args.output == "json":
        out.document({"made": made, "subscription": settings.replay_subscription_path})
        return ExitCode.OK
    for name in made:
        out.line(f"made {name}")
    out.line(
        f"replays of {settings.subscription_path} go to {settings.replay_topic_path}; "
        f"its worker consumes {settings.replay_subscription_path} beside its own"
    )
    return ExitCode.OK


def _verdict(result: ReplayResult, topic: str) -> str:
    if result.kind is ReplayOutcome.DRY_RUN:
        return f"would replay to {topic}"
    return printable(result.outcome, None)


def cmd_replay(args: argparse.Namespace, out: Output) -> int:
    """``jobs replay KEY... | --all-failed``: republish failed jobs."""
    if bool(args.all_failed) == bool(args.keys):
        raise ConfigError("jobs replay: give job keys or --all-failed (not both)")
    settings = environment.settings_from(args)
    store = environment.job_store(settings)
    subscription = settings.subscription_path
    keys: Sequence[str] = args.keys or ()
    jobs = list(list_failed(store.client, store.collection, subscription, keys=keys))
    unknown = unknown_keys(subscription, keys, jobs)
    if unknown:
        named = ", ".join(printable(key) for key in unknown)
        out.error(f"no job {named} on {subscription}: nothing was replayed")
        return ExitCode.NOT_FOUND
    publisher = clients.publisher_client(settings)
    if args.topic:
        target = settings.topic_path(args.topic)
        where = f"to {target}"
    else:
        subscriber = clients.subscriber_client(settings)
        try:
            found = replay_route.route(
                settings, subscriber=subscriber, publisher=publisher, fan_out=args.fan_out
            )
        finally:
            subscriber.close()
        target, where = found.topic, found.describe()
    publish = clients.publisher_function(publisher)
    total = len(jobs)
    text = args.output != "json"

    with out.progress(total, "replaying") as bar:

        def progress(index: int, result: ReplayResult) -> None:
            if not text:
                return
            line = f"[{index}/{total}] {printable(result.job.key or result.job.doc_id)}: "
            line += _verdict(result, target)
            if bar is None:
                out.line(line)
            else:
                bar.update(index, None if result.kind in _DONE else line)

        results = replay(
            store,
            jobs,
            topic=target,
            publish=publish,
            key_attribute=settings.key_attribute,
            dry_run=args.dry_run,
            progress=progress,
            timeout_s=settings.ack_timeout_seconds,
        )
    done = sum(1 for r in results if r.kind in _DONE)
    code = ExitCode.OK if done == total else ExitCode.FAILED
    if not text:
        out.document(
            {
                "topic": target,
                "reaches": where,
                "dry_run": args.dry_run,
                "total": total,
                "replayed": done,
                "jobs": [
                    {
                        "key": r.job.key,
                        "document": r.job.doc_id,
                        "outcome": r.kind.value,
                        "reason": r.reason,
                    }
                    for r in results
                ],
            }
        )
        return code
    verb = "would replay" if args.dry_run else "replayed"
    out.line(f"{verb} {done} of {total} job(s) {where}")
    for line in summary(results, dry_run=args.dry_run):
        out.line(line)
    return code


def summary(results: Sequence[ReplayResult], *, dry_run: bool) -> list[str]:
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
