"""The callback threads' CPU per message on the real path: a stream of the emulator's Pub/Sub.

``python -m benchmarks.callbacks`` publishes ``--messages`` messages to a fresh
exactly-once subscription of the Pub/Sub emulator, then consumes them with a
stock subscriber at ``--in-flight`` messages (``FlowControl(max_messages=N)``
and a ``ThreadScheduler`` of N threads), once with the stock exactly-once
callback (``message.ack_with_response().result()``) and once with the wrapper
around a one-step handler on the in-memory store, alternately for ``--rounds``
rounds (``--threads N``: N callback threads instead, as the client's defaults
admit 1,000 messages for 10; ``--lean``: and the lean prototype of one object
per delivery, :class:`benchmarks.lean.LeanDelivery`, on a started wrapper's
parts, what a redesign could save on the real path; ``--floor``: and the floor,
:class:`benchmarks.floor.FloorDelivery`, a one-step delivery's work alone in one
function on an in-memory store of its own, what no arrangement of that work in
Python can go below). Each callback's thread
CPU is taken around it (``time.thread_time()``), and the process's over the
whole consumption: what the wrapper's Python costs the callback threads when
they take turns, as the consumers of the full run's ``wrapped-1-memory``
scenario do, which :mod:`benchmarks.inprocess` cannot show (its fake messages
come from no stream: the acks' path on a stock client's stream is not taken).
``--profile`` runs one more round of each side with a ``cProfile`` per
callback thread and prints the Python calls per message: a count that does
not move with the host's speed, where CPU figures need repeats
(``docs/benchmarks-history.md``, fourteenth and fifteenth passes). It uses
the emulator named by ``PUBSUB_EMULATOR_HOST``, or starts one. ``--store
firestore``: the wrapper, the prototype and the floor write to the library's
default (batching) store on the Firestore emulator instead (named by
``FIRESTORE_EMULATOR_HOST``, or started with the other). Nothing here
is a test or a target.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

from benchmarks.floor import FloorDelivery
from benchmarks.lean import LeanDelivery, runtime_of
from pubsub_worker import ExactlyOnce, Job, Settings
from pubsub_worker.stores import MemoryJobStore

__all__ = ["Consumed", "consume", "main"]

Side = Literal["stock", "wrapped", "lean", "floor"]
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Consumed:
    """One side's consumption of the messages: CPU per message, and calls if profiled."""

    side: Side
    callbacks_ms: float
    """The callback threads' CPU per message, taken around each callback."""
    process_ms: float
    """The process's CPU per message over the consumption (the client's threads too)."""
    calls: float | None
    """Python calls per message on the callback threads (``--profile``), else None."""
    threads: int
    """Distinct callback threads that ran a callback."""


def _stock(message: Any) -> None:
    message.ack_with_response().result(timeout=_TIMEOUT_S)


def _handler(message: Any, job: Job) -> None:
    job.step("fetch", lambda: len(message.data))


class _Profiles:
    """A ``cProfile.Profile`` per callback thread, merged at the end."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.all: list[cProfile.Profile] = []

    def mine(self) -> cProfile.Profile:
        profile: cProfile.Profile | None = getattr(self._local, "profile", None)
        if profile is None:
            profile = self._local.profile = cProfile.Profile()
            with self._lock:
                self.all.append(profile)
        return profile

    def calls(self) -> int:
        merged = pstats.Stats(self.all[0])
        for profile in self.all[1:]:
            merged.add(profile)
        return int(merged.total_calls)  # type: ignore[attr-defined]


def consume(
    side: Side,
    *,
    subscription: str,
    messages: int,
    in_flight: int,
    subscriber: Any,
    threads: int | None = None,
    profile: bool = False,
    firestore: Any = None,
) -> Consumed:
    """Consume ``messages`` already published to ``subscription`` with one side's callback,
    ``in_flight`` admitted at once by flow control, on ``threads`` callback threads (default:
    as many as in flight). ``firestore``: a Firestore client, whose batching store (a fresh
    collection) the wrapper, the lean prototype and the floor write to instead of memory."""
    inner, wrapped, store = _side(side, subscription, subscriber, firestore)
    profiles = _Profiles() if profile else None
    done = threading.Semaphore(0)
    lock = threading.Lock()
    spent = [0.0]
    seen: set[int] = set()

    def callback(message: Any) -> None:
        started = time.thread_time()
        profiler = profiles.mine() if profiles is not None else None
        if profiler is not None:
            profiler.enable()
        try:
            inner(message)
        finally:
            if profiler is not None:
                profiler.disable()
            used = time.thread_time() - started
            with lock:
                spent[0] += used
                seen.add(threading.get_ident())
            done.release()

    executor = ThreadPoolExecutor(max_workers=threads or in_flight, thread_name_prefix="callbacks")
    process = time.process_time()
    future = subscriber.subscribe(
        subscription,
        callback=callback,
        flow_control=pubsub_v1.types.FlowControl(max_messages=in_flight),
        scheduler=ThreadScheduler(executor),
    )
    try:
        for _ in range(messages):
            if not done.acquire(timeout=_TIMEOUT_S):
                raise RuntimeError(f"{side}: a message was not consumed in {_TIMEOUT_S:.0f} s")
        if wrapped is not None:  # its last acks sent before the stream closes, as run() does
            wrapped.drain(_TIMEOUT_S)
        process = time.process_time() - process
    finally:
        future.cancel()
        future.result(timeout=_TIMEOUT_S)
        executor.shutdown(wait=True)
        if wrapped is not None:
            wrapped.close()  # its lease keeper and acks' thread, not left to the next round
        if store is not None and hasattr(store, "close"):
            store.close()  # a batching store's writers
    return Consumed(
        side,
        spent[0] / messages * 1000,
        process / messages * 1000,
        profiles.calls() / messages if profiles is not None else None,
        len(seen),
    )


def _side(
    side: Side, subscription: str, subscriber: Any, firestore: Any
) -> tuple[Callable[[Any], None], ExactlyOnce | None, Any]:
    """One side's callback, its started wrapper (if it has one) and its store (if any)."""
    if side == "stock":
        return _stock, None, None
    store = MemoryJobStore() if firestore is None else _batching_store(firestore)
    if side == "floor":  # the work alone, no wrapper
        return FloorDelivery(store, subscription=subscription, key_attribute="job"), None, store
    project = subscription.split("/")[1]
    wrapped = ExactlyOnce(
        _handler,
        settings=Settings(subscription=subscription, project=project, collection="callbacks"),
        store=store,
        subscriber=subscriber,
    )
    wrapped.start()
    # the lean prototype runs on the started wrapper's parts; what it cannot do, it
    # raises, and the client ends the stream with it
    return (LeanDelivery(runtime_of(wrapped)) if side == "lean" else wrapped), wrapped, store


def _batching_store(client: Any) -> Any:
    """The library's default store on a fresh collection of ``client``'s database."""
    from pubsub_worker.stores.batching import BatchingFirestoreJobStore  # noqa: PLC0415

    return BatchingFirestoreJobStore(client, f"callbacks-{uuid.uuid4().hex[:12]}")


@contextmanager
def _emulator(*, firestore: bool = False) -> Iterator[str]:
    """The emulators' project: the one named by the environment, or ones started here (the
    Firestore emulator too with ``firestore``)."""
    named = os.environ.get("PUBSUB_EMULATOR_HOST") and (
        not firestore or os.environ.get("FIRESTORE_EMULATOR_HOST")
    )
    if named:
        yield os.environ.get("GOOGLE_CLOUD_PROJECT", "bench")
        return
    from emulator import start_emulators  # noqa: PLC0415

    with start_emulators(firestore=firestore) as emulators:
        emulators.export_env()
        yield emulators.project


def _round(
    side: Side, args: argparse.Namespace, project: str, *, profile: bool, firestore: Any
) -> Consumed:
    from emulator import create_subscription, delete_subscription  # noqa: PLC0415

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    handle = create_subscription(
        project=project, publisher=publisher, subscriber=subscriber, ack_deadline_seconds=60
    )
    try:
        run = uuid.uuid4().hex[:8]
        published = [
            publisher.publish(handle.topic_path, b"x" * 256, job=f"{run}-{n}")
            for n in range(args.messages)
        ]
        for sent in published:
            sent.result(timeout=_TIMEOUT_S)
        return consume(
            side,
            subscription=handle.subscription_path,
            messages=args.messages,
            in_flight=args.in_flight,
            subscriber=subscriber,
            threads=args.threads,
            profile=profile,
            firestore=firestore,
        )
    finally:
        delete_subscription(handle, publisher=publisher, subscriber=subscriber)
        subscriber.close()
        publisher.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.callbacks", description=__doc__)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--in-flight", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lean", action="store_true")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("--store", choices=("memory", "firestore"), default="memory")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if min(args.messages, args.in_flight, args.rounds, args.threads or 1) < 1:
        parser.error("--messages, --in-flight, --threads and --rounds must be at least 1")
    sides: tuple[Side, ...] = (
        "stock",
        "wrapped",
        *(("lean",) if args.lean else ()),
        *(("floor",) if args.floor else ()),
    )
    runs: dict[Side, list[Consumed]] = {side: [] for side in sides}
    with _emulator(firestore=args.store == "firestore") as project:
        firestore = None
        if args.store == "firestore":
            from google.cloud import firestore as firestore_v1  # noqa: PLC0415 - env set now

            firestore = firestore_v1.Client(project=project)
        for number in range(1, args.rounds + 1):
            for side in sides if number % 2 else sides[::-1]:
                run = _round(side, args, project, profile=False, firestore=firestore)
                runs[side].append(run)
                print(
                    f"[{number}/{args.rounds}] {side:7}  callback threads "
                    f"{run.callbacks_ms:.3f} ms/msg, process {run.process_ms:.3f} ms/msg",
                    flush=True,
                )
        for side in sides:
            callbacks = statistics.median(r.callbacks_ms for r in runs[side])
            process = statistics.median(r.process_ms for r in runs[side])
            print(
                f"{side}: callback threads {callbacks:.3f} ms/msg, process {process:.3f} ms/msg "
                f"(medians of {args.rounds} runs of {args.messages} messages, "
                f"{args.in_flight} in flight, {args.threads or args.in_flight} threads, "
                f"{args.store} store)"
            )
        if args.profile:
            for side in sides:
                calls = _round(side, args, project, profile=True, firestore=firestore).calls
                print(f"{side}: {calls:.0f} Python calls a message on the callback threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
