"""The library's own Python per message, in one process: no Pub/Sub, no Firestore, no threads.

``python -m benchmarks.inprocess`` wraps a one-step handler with
:func:`pubsub_worker.exactly_once` on the in-memory store and hands it
``--messages`` fake messages one after another, concluding each on its
callback thread (no completer hand-off). What it measures is the Python a
delivery runs through the wrapper: receipt, key and identity, the gate, the
claim, the step, the completion and the ack call, with the store's cost
taken out as far as the in-memory store allows. It is the A/B tool for
changes to the per-message path: run it on the code before and after,
alternately, and compare medians.

``--profile N`` prints the N functions with the most own time (``cProfile``)
and the calls per message. Nothing here is a test or a target; the
benchmark run (:mod:`benchmarks.run`) is where figures against the stock
client come from.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Any

import pubsub_worker
from pubsub_worker.stores import MemoryJobStore

__all__ = ["main", "run_once"]

SUBSCRIPTION = "projects/bench/subscriptions/inprocess"


class _Message:
    """The parts of a Pub/Sub message the wrapper reads, acked at once."""

    def __init__(self, number: int) -> None:
        self.data = b"x" * 256
        self.attributes = {"op": f"op-{number}"}
        self.message_id = str(number)
        self.ack_id = f"ack-{number}"
        self.publish_time = datetime.now(timezone.utc)
        self.delivery_attempt: int | None = None
        self.exactly_once_enabled = True
        self.opentelemetry_data: object | None = None
        self.acked = False

    def ack_with_response(self) -> Future[Any]:
        self.acked = True
        future: Future[Any] = Future()
        future.set_result(None)
        return future

    def ack(self) -> None:
        self.acked = True

    def nack(self) -> None:
        raise AssertionError(f"message {self.message_id} nacked")

    def drop(self) -> None:
        raise AssertionError(f"message {self.message_id} dropped")

    def modify_ack_deadline(self, seconds: int) -> None:
        pass

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(None)
        return future


def _publish(topic: str, data: bytes, **attributes: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result("1")
    return future


def _handler(message: Any, job: pubsub_worker.Job) -> None:
    job.step("one", lambda: 1)


def run_once(messages: int, profile: cProfile.Profile | None = None) -> float:
    """CPU seconds per message for ``messages`` one-step deliveries, each acked."""
    wrapped = pubsub_worker.exactly_once(
        _handler,
        settings=pubsub_worker.Settings(
            subscription=SUBSCRIPTION, key_attribute="op", lease_seconds=60
        ),
        store=MemoryJobStore(),
        publisher=_publish,
    )
    wrapped.start(check_subscription=False)
    batch = [_Message(n) for n in range(messages)]
    try:
        started = time.process_time()
        if profile is not None:
            profile.enable()
        for message in batch:
            wrapped(message)
        if profile is not None:
            profile.disable()
        spent = time.process_time() - started
    finally:
        wrapped.close()
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return spent / messages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inprocess", description=__doc__)
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    logging.getLogger("pubsub_worker").setLevel(logging.WARNING)
    run_once(min(args.messages, 1000))  # warm-up: imports, caches
    figures = []
    for n in range(args.repeats):
        figures.append(run_once(args.messages) * 1000)
        print(f"[{n + 1}/{args.repeats}] {figures[-1]:.3f} ms CPU per message", file=sys.stderr)
    print(
        f"CPU per message: median {statistics.median(figures):.3f} ms, "
        f"min {min(figures):.3f} ms over {args.repeats} runs of {args.messages} messages"
    )
    if args.profile:
        profile = cProfile.Profile()
        run_once(args.messages, profile)
        stats = pstats.Stats(profile)
        calls = sum(row[1] for row in stats.stats.values())  # type: ignore[attr-defined]
        print(f"Python function calls per message: {calls / args.messages:.0f}")
        stats.sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
