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

``--threads N`` hands the messages to N callback threads instead, at most N
at a time (as flow control would), their acks answered by one other thread
(as the stock client's dispatcher answers them), and runs the stock
exactly-once callback (``message.ack_with_response().result()``) the same
way beside it: the wrapper's own Python when callbacks run side by side,
which costs more than alone (``docs/benchmarks-history.md``, seventh pass).

``--in-flight N`` (with ``--threads``) hands over up to N messages at once
instead of one per thread, the rest queued for the threads, as the client's
default flow control admits 1,000 messages for its 10 threads.

``--store firestore`` (with ``--threads``) runs the wrapper on the default
(batching) Firestore store instead, on the emulator named by
``FIRESTORE_EMULATOR_HOST`` or one started here, a fresh collection per run:
the writes' own cost when callbacks run side by side (group commit, a
thread's wait for its write, the batch's RPC), without Pub/Sub's. Beside
CPU it reports the threads' context switches per message (each a wake-up:
``benchmarks/threads.py``) and the ``BatchWrite`` RPCs per message, and the
wrapper's CPU and switches by thread role (its callback threads, the batch
writers, gRPC's threads, the rest).

``--evict MB`` empties the CPU's caches before each message (it copies a
buffer of ``MB`` megabytes; 64 is past this machine's 32 MB last-level
cache) and times the messages alone: the path run cold, as a consumer runs
it when other busy processes share its core between one message's steps
(the emulators, on the benchmark's machine). Cold, the same Python costs
several times what it costs warm, and the more of it a message runs, the
more it pays (``docs/benchmarks-history.md``, "Run cold").

``--floor`` times :class:`benchmarks.floor.FloorDelivery` beside the
library, alternately, on the same messages and store (with ``--threads``:
on the same callback threads, and with ``--store firestore`` on its own
batching store, each write waited for): the same writes, digests, key gate
and ack in one function, none of the library's structure around them (what
a delivery's work costs in Python, against what the library spends on it),
and :class:`benchmarks.lean.LeanDelivery` beside both: a one-step delivery
through the library's own parts (tracker, gate, lease keeper, claim, outcome
table, logger, trace, metrics, hooks, settlement) in one object, a prototype
of what one object per delivery would cost.

``--profile N`` prints the N functions with the most own time (``cProfile``)
and the calls per message. Nothing here is a test or a target; the
benchmark run (:mod:`benchmarks.run`) is where figures against the stock
client come from.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import queue
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import pubsub_worker
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores.base import JobStore

from .floor import FloorDelivery, run_floor
from .lean import LeanDelivery, runtime_of
from .threads import ROLES, thread_cpu_s, thread_switches

__all__ = [
    "Threaded",
    "firestore_client",
    "floor_once",
    "lean_once",
    "main",
    "run_once",
    "run_threaded",
]

SUBSCRIPTION = "projects/bench/subscriptions/inprocess"

Side = Literal["stock", "wrapped", "floor", "lean"]
"""Whose callback a threaded run runs: the stock exactly-once callback, the wrapper,
:class:`benchmarks.floor.FloorDelivery` or :class:`benchmarks.lean.LeanDelivery`."""


class _Manager:
    """A stock client's streaming pull manager, as far as the wrapper reads it: at its
    defaults it does not wait for callbacks at shutdown; its acks go the stock way."""

    _await_callbacks_on_shutdown = False

    def exactly_once(self) -> bool:
        return True


_MANAGER = _Manager()


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
        self._exactly_once_delivery_enabled_func = _MANAGER.exactly_once
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


class _Answerer:
    """One thread that answers acks, as the stock client's dispatcher does: not the caller's."""

    def __init__(self, expected: int) -> None:
        self._pending: queue.SimpleQueue[Future[Any] | None] = queue.SimpleQueue()
        self._left = expected
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._answer, name="bench-acks", daemon=True)
        self._thread.start()

    def ack_with_response(self) -> Future[Any]:
        future: Future[Any] = Future()
        self._pending.put(future)
        return future

    def _answer(self) -> None:
        while (future := self._pending.get()) is not None:
            future.set_result(None)
            self._left -= 1
            if not self._left:
                self.done.set()

    def close(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=10)


class _AnsweredMessage(_Message):
    """A fake message whose ack is answered by the :class:`_Answerer`'s thread."""

    def __init__(self, number: int, answerer: _Answerer) -> None:
        super().__init__(number)
        self._answerer = answerer

    def ack_with_response(self) -> Future[Any]:
        self.acked = True
        return self._answerer.ack_with_response()


def _stock(message: Any) -> None:
    message.ack_with_response().result()


def _publish(topic: str, data: bytes, **attributes: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result("1")
    return future


def _handler(message: Any, job: pubsub_worker.Job) -> None:
    job.step("one", lambda: 1)


def _started_wrapper(store: JobStore | None = None) -> pubsub_worker.ExactlyOnce:
    """The one-step handler wrapped on ``store`` (a fresh in-memory one by default), started."""
    wrapped: pubsub_worker.ExactlyOnce = pubsub_worker.exactly_once(
        _handler,
        settings=pubsub_worker.Settings(
            subscription=SUBSCRIPTION, key_attribute="op", lease_seconds=60
        ),
        store=MemoryJobStore() if store is None else store,
        publisher=_publish,
    )
    wrapped.start(check_subscription=False)
    return wrapped


class _Evictor:
    """Empties the CPU's caches: copies one buffer of ``megabytes`` over another."""

    def __init__(self, megabytes: int) -> None:
        size = megabytes * 1024 * 1024
        self._target = bytearray(b"\x01") * size
        self._source = bytearray(b"\x02") * size

    def __call__(self) -> None:
        self._target[:] = self._source


def run_once(messages: int, profile: cProfile.Profile | None = None, *, evict_mb: int = 0) -> float:
    """CPU seconds per message for ``messages`` one-step deliveries, each acked.

    ``evict_mb``: empty the caches before each message (:class:`_Evictor`)
    and count only the messages' own time.
    """
    wrapped = _started_wrapper()
    batch = [_Message(n) for n in range(messages)]
    evict = _Evictor(evict_mb) if evict_mb > 0 else None
    try:
        if profile is not None:
            profile.enable()
        if evict is None:
            started = time.process_time()
            for message in batch:
                wrapped(message)
            spent = time.process_time() - started
        else:
            spent = 0.0
            for message in batch:
                evict()
                started = time.thread_time()
                wrapped(message)
                spent += time.thread_time() - started
        if profile is not None:
            profile.disable()
    finally:
        wrapped.close()
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return spent / messages


@dataclass(frozen=True)
class Threaded:
    """One threaded run's figures, per message."""

    cpu_ms: float
    rpcs: float
    """``BatchWrite`` RPCs per message (0 without Firestore)."""
    cpu_ms_by_role: dict[str, float] = field(default_factory=dict)
    """CPU ms per message of the process's threads by role (:data:`benchmarks.threads.ROLES`:
    the callback threads, the batch writers, gRPC's...); {} off Linux."""
    switches_by_role: dict[str, float] = field(default_factory=dict)
    """Context switches per message by the same roles; {} off Linux."""

    @property
    def switches(self) -> float:
        """Context switches of the process's threads (voluntary and not), per message."""
        return sum(self.switches_by_role.values())


@contextmanager
def firestore_client() -> Iterator[Any]:
    """A Firestore client: the emulator named by the environment, or one started here."""
    from google.cloud import firestore  # noqa: PLC0415 - after the emulator's env is set

    if os.environ.get("FIRESTORE_EMULATOR_HOST"):
        yield firestore.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "bench"))
        return
    from emulator import start_emulators  # noqa: PLC0415

    with start_emulators(pubsub=False) as emulators:
        os.environ.update(emulators.env())
        yield firestore.Client(project=emulators.project)


@contextmanager
def _firestore_store(client: Any) -> Iterator[Any]:
    """A batching Firestore store on a fresh collection of ``client``'s database, closed after."""
    from pubsub_worker.stores.batching import BatchingFirestoreJobStore  # noqa: PLC0415

    store = BatchingFirestoreJobStore(client, f"inprocess-{uuid.uuid4().hex[:12]}")
    try:
        yield store
    finally:
        store.close()


def run_threaded(
    messages: int,
    threads: int,
    *,
    side: Side,
    client: Any = None,
    in_flight: int | None = None,
) -> Threaded:
    """Figures per message with ``threads`` callback threads running ``side``'s callback.

    At most ``in_flight`` messages (default: ``threads``) are handed over at
    once (a semaphore, as flow control; more than ``threads`` wait in the
    pool's queue, as the client's defaults admit 1,000 for 10 threads); each
    ack is answered by one other thread. ``client``: a Firestore client, for
    the wrapper (or the floor) on the batching store.
    """
    answerer = _Answerer(messages)
    writes = side != "stock" and client is not None
    with _firestore_store(client) if writes else nullcontext(None) as store:
        wrapper: Any = None
        callback: Callable[[Any], None] = _stock
        if side == "wrapped":
            wrapper = callback = _started_wrapper(store)
        elif side == "lean":
            wrapper = _started_wrapper(store)
            callback = LeanDelivery(runtime_of(wrapper))
        elif side == "floor":
            callback = FloorDelivery(
                MemoryJobStore() if store is None else store,
                subscription=SUBSCRIPTION,
                key_attribute="op",
            )
        slots = threading.BoundedSemaphore(threads if in_flight is None else in_flight)
        batch = [_AnsweredMessage(n, answerer) for n in range(messages)]

        def deliver(message: Any) -> None:
            try:
                callback(message)
            finally:
                slots.release()

        pool = ThreadPoolExecutor(threads, thread_name_prefix="bench")  # role: callbacks
        try:
            list(pool.map(lambda _: None, range(threads)))  # the threads started, not timed
            switches_before, cpu_before = thread_switches(), thread_cpu_s()
            started = time.process_time()
            for message in batch:
                slots.acquire()
                pool.submit(deliver, message)
            if not answerer.done.wait(120):
                raise AssertionError("not every ack was answered")
            spent = time.process_time() - started
            switches_by_role = _per_message(switches_before, thread_switches(), messages, 1)
            cpu_by_role = _per_message(cpu_before, thread_cpu_s(), messages, 1000)
        finally:
            pool.shutdown()
            answerer.close()
            if wrapper is not None:
                wrapper.close()
        rpcs = store.batcher.batches / messages if store is not None else 0.0
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return Threaded(spent / messages * 1000, rpcs, cpu_by_role, switches_by_role)


def _per_message(
    before: Mapping[str, float], after: Mapping[str, float], messages: int, scale: float
) -> dict[str, float]:
    """Each role's growth between two readings, per message, times ``scale``."""
    return {role: (after[role] - before.get(role, 0.0)) / messages * scale for role in after}


def _side_by_side(
    messages: int,
    threads: int,
    repeats: int,
    client: Any = None,
    in_flight: int | None = None,
    *,
    floor: bool = False,
) -> int:
    """The stock callback and the wrapper in turn (``floor``: and the floor), ``repeats``
    times each; medians."""
    run_threaded(min(messages, 1000), threads, side="wrapped", client=client)  # warm-up
    stock: list[Threaded] = []
    wrapped: list[Threaded] = []
    floors: list[Threaded] = []
    leans: list[Threaded] = []
    for n in range(repeats):
        stock.append(run_threaded(messages, threads, side="stock", in_flight=in_flight))
        wrapped.append(
            run_threaded(messages, threads, side="wrapped", client=client, in_flight=in_flight)
        )
        if floor:
            floors.append(
                run_threaded(messages, threads, side="floor", client=client, in_flight=in_flight)
            )
            leans.append(
                run_threaded(messages, threads, side="lean", client=client, in_flight=in_flight)
            )
        print(
            f"[{n + 1}/{repeats}] stock {stock[-1].cpu_ms:.3f}, wrapped "
            f"{wrapped[-1].cpu_ms:.3f}"
            + (f", lean {leans[-1].cpu_ms:.3f}, floor {floors[-1].cpu_ms:.3f}" if floor else "")
            + " ms CPU per message",
            file=sys.stderr,
        )

    def median(runs: list[Threaded], figure: Callable[[Threaded], float]) -> float:
        return statistics.median(figure(run) for run in runs)

    base, ours = median(stock, lambda r: r.cpu_ms), median(wrapped, lambda r: r.cpu_ms)
    store = "the batching Firestore store" if client is not None else "the in-memory store"
    print(
        f"{threads} callback thread(s)"
        + (f", up to {in_flight} in flight" if in_flight is not None else "")
        + f", {messages} messages, medians of {repeats}: stock "
        f"{base:.3f} ms, wrapped {ours:.3f} ms CPU per message ({ours / base:.1f}x; the "
        f"wrapper's own {ours - base:.3f} ms), on {store}\n"
        f"context switches per message: stock {median(stock, lambda r: r.switches):.1f}, "
        f"wrapped {median(wrapped, lambda r: r.switches):.1f}"
        + (
            f"; BatchWrite RPCs per message {median(wrapped, lambda r: r.rpcs):.2f}"
            if client is not None
            else ""
        )
    )
    by_role = _by_role(wrapped)
    if by_role:
        print(f"the wrapper by thread, CPU ms / context switches per message: {by_role}")
    if leans:
        print(
            f"the lean prototype (the library's parts, one object per delivery, each write "
            f"waited for): {median(leans, lambda r: r.cpu_ms):.3f} ms CPU per message, "
            f"{median(leans, lambda r: r.switches):.1f} context switches"
            + (
                f", BatchWrite RPCs {median(leans, lambda r: r.rpcs):.2f}"
                if client is not None
                else ""
            )
        )
    if floors:
        print(
            f"the floor (the same writes, digests, key gate and ack in one function, each write "
            f"waited for): {median(floors, lambda r: r.cpu_ms):.3f} ms CPU per message, "
            f"{median(floors, lambda r: r.switches):.1f} context switches"
            + (
                f", BatchWrite RPCs {median(floors, lambda r: r.rpcs):.2f}"
                if client is not None
                else ""
            )
        )
    return 0


def _by_role(runs: list[Threaded]) -> str:
    """Each role's CPU and switches per message, medians over ``runs``, where a thread of it
    ran ("" off Linux)."""
    shown = []
    for role in ROLES:
        cpu = statistics.median(run.cpu_ms_by_role.get(role, 0.0) for run in runs)
        switches = statistics.median(run.switches_by_role.get(role, 0.0) for run in runs)
        if cpu >= 0.0005 or switches >= 0.05:
            shown.append(f"{role} {cpu:.3f} / {switches:.1f}")
    return ", ".join(shown)


def floor_once(messages: int) -> float:
    """CPU seconds per message of :class:`benchmarks.floor.FloorDelivery` on the same
    messages and store as :func:`run_once`."""
    batch = [_Message(n) for n in range(messages)]
    seconds = run_floor(MemoryJobStore(), batch, subscription=SUBSCRIPTION, key_attribute="op")
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return seconds


def lean_once(messages: int) -> float:
    """CPU seconds per message of :class:`benchmarks.lean.LeanDelivery` on the same
    messages and store as :func:`run_once` (a started worker's parts)."""
    wrapped = _started_wrapper()
    deliver = LeanDelivery(runtime_of(wrapped))
    batch = [_Message(n) for n in range(messages)]
    try:
        started = time.process_time()
        for message in batch:
            deliver(message)
        spent = time.process_time() - started
    finally:
        wrapped.close()
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return spent / messages


def _against_floor(messages: int, repeats: int) -> int:
    run_once(min(messages, 1000))  # warm-up: imports, caches
    lean_once(min(messages, 1000))
    floor_once(min(messages, 1000))
    library, lean, floor = [], [], []
    for n in range(repeats):
        library.append(run_once(messages) * 1000)
        lean.append(lean_once(messages) * 1000)
        floor.append(floor_once(messages) * 1000)
        print(
            f"[{n + 1}/{repeats}] library {library[-1]:.3f}, lean {lean[-1]:.3f}, "
            f"floor {floor[-1]:.3f} ms CPU per message",
            file=sys.stderr,
        )
    lib, mid, low = (statistics.median(runs) for runs in (library, lean, floor))
    print(
        f"CPU per message, medians of {repeats} runs of {messages} messages: the library "
        f"{lib:.3f} ms, the lean prototype {mid:.3f} ms (the library's parts, one object per "
        f"delivery), the floor {low:.3f} ms (the same writes, digests, key gate and ack in "
        f"one function): the library {lib / low:.1f}x the floor, {lib - low:.3f} ms of "
        f"structure, of which {lib - mid:.3f} ms the objects around the parts"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inprocess", description=__doc__)
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--threads", type=int, default=0, metavar="N")
    parser.add_argument("--evict", type=int, default=0, metavar="MB")
    parser.add_argument("--store", choices=("memory", "firestore"), default="memory")
    parser.add_argument("--in-flight", type=int, default=None, metavar="N")
    parser.add_argument("--floor", action="store_true")
    args = parser.parse_args(argv)
    if args.floor and (args.evict or args.profile):
        parser.error("--floor times the messages as they run: not with --evict or --profile")
    if args.evict < 0:
        parser.error(f"--evict must be >= 0 MB, got {args.evict}")
    if args.evict and args.threads:
        parser.error("--evict times one thread's messages: not with --threads")
    if args.in_flight is not None and (args.in_flight < 1 or not args.threads):
        parser.error(f"--in-flight must be at least 1, with --threads; got {args.in_flight}")
    if args.store == "firestore" and not args.threads:
        parser.error("--store firestore runs callbacks side by side: give --threads")
    logging.getLogger("pubsub_worker").setLevel(logging.WARNING)
    if args.store == "firestore":
        with firestore_client() as client:
            return _side_by_side(
                args.messages,
                args.threads,
                args.repeats,
                client,
                args.in_flight,
                floor=args.floor,
            )
    if args.threads > 0:
        return _side_by_side(
            args.messages, args.threads, args.repeats, None, args.in_flight, floor=args.floor
        )
    if args.floor:
        return _against_floor(args.messages, args.repeats)
    run_once(min(args.messages, 1000))  # warm-up: imports, caches
    figures = []
    for n in range(args.repeats):
        figures.append(run_once(args.messages, evict_mb=args.evict) * 1000)
        print(f"[{n + 1}/{args.repeats}] {figures[-1]:.3f} ms CPU per message", file=sys.stderr)
    cold = f" (caches emptied of {args.evict} MB before each)" if args.evict else ""
    print(
        f"CPU per message{cold}: median {statistics.median(figures):.3f} ms, "
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
