"""One consumer process: ``python -m benchmarks.consumer CONFIG_JSON``.

The orchestrator (:mod:`benchmarks.fleet`) starts one of these per process of
a run, so the peak RSS and CPU time measured here are this consumer's own.
It decides nothing about phases: it subscribes on ``go`` and reports every
message it finished; the orchestrator knows which messages it published in
which phase and when a phase is complete (across all processes of a fleet).

Protocol, one JSON object per line (``->`` stdout, ``<-`` stdin)::

    -> {"event": "ready", ...}        clients built and warmed
    <- go                             subscribe
    -> {"event": "mark", "name": "start", ...}   CPU, RPC counts, RSS at the start
    -> {"event": "progress", "done": [...], ...} every 50 ms: messages finished since
    <- mark NAME                      the orchestrator closes a phase
    -> {"event": "mark", "name": NAME, ...}
    <- exit
    -> {"event": "result", ...}       the wrapper's metrics; then the process exits

A finished message is ``[message_id, start, end, done, publish_wall, done_wall]``:
the callback's start and end and the moment its ack was answered, on the
machine's monotonic clock (shared by every process, so a fleet's times
compare), and publish and ack times on the wall clock for latency. For the
stock EOD callback ``done`` is its end (it awaits the ack), and so for a
wrapped callback that awaits its answer (the one added line around it); for a
job-style handler it is the ack's answer, which arrives after the callback
returned (the wrapper sends its ack without waiting: the message keeps its
flow-control slot until the answer). A plain ``ack()`` without exactly-once
has no answer: ``done`` is the callback's end. The process exits on ``exit``
or when stdin closes (the orchestrator died).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import grpc
from google.cloud.pubsub_v1.subscriber.message import Message
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler
from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

from benchmarks.cores import pin_self_from_env
from benchmarks.counting import RpcCounter
from benchmarks.scenarios import SCENARIOS, Scenario
from benchmarks.threads import thread_cpu_s, thread_switches

__all__ = ["ConsumerConfig", "main"]

# The channel options of the library's subscriber (large EOD error trailers; no 4 MiB cap on
# a streaming pull response, which a few 1 MB messages exceed), for stock and wrapped alike.
_CHANNEL_OPTIONS = [
    ("grpc.max_metadata_size", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
_FLUSH_S = 0.05
_ACKING = frozenset({"complete", "ack", "review"})


@dataclass(frozen=True)
class ConsumerConfig:
    """What one consumer process does."""

    scenario: str
    subscription: str
    project: str
    collection: str
    concurrency: int
    """``--concurrency``: flow control and threads of ``fixed`` scenarios without their own."""
    index: int = 0
    """This process's place in the fleet (for logs)."""


class _Recorder:
    """Times each delivery; hands finished ones to the flusher. Thread-safe.

    ``callbacks_end``: every callback's return is reported (:meth:`ended`), so a message
    answered while its callback still runs (one that awaits its ack's answer, as the
    unchanged stock callback behind the one added line does) finishes when the callback
    returns, as the stock EOD callback's does, and its callback time is its thread's.
    False for ``run()``, whose callback's end is the wrapper's ``before_ack`` hook.
    """

    def __init__(self, *, callbacks_end: bool = True) -> None:
        self._callbacks_end = callbacks_end
        self._lock = threading.Lock()  # guards everything below
        # message id -> [start, end, publish_wall, answered]: end 0 while the callback runs,
        # answered 1.0 once the ack was answered before the callback returned
        self._open: dict[str, list[float]] = {}
        self._finished: list[list[Any]] = []
        self.callbacks = 0
        self.ack_failures = 0
        self.outcomes: Counter[str] = Counter()

    def started(self, message_id: str, publish_wall: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.callbacks += 1
            self._open[message_id] = [now, 0.0, publish_wall or 0.0, 0.0]

    def noted(self, message: Message) -> None:
        """The publish time, for a path whose callback this module cannot wrap (``run()``)."""
        with self._lock:
            entry = self._open.get(message.message_id)
            if entry is not None:
                entry[2] = message.publish_time.timestamp()

    def ended(self, message_id: str) -> None:
        now = time.monotonic()
        with self._lock:
            entry = self._open.get(message_id)
            if entry is None or entry[1]:
                return
            entry[1] = now
            if entry[3]:  # answered while the callback ran: done as it returns
                self._finish(message_id, now, time.time())

    def acked(self, message_id: str) -> None:
        """The ack of ``message_id`` was answered with success: the message is done (once
        its callback returned, when callbacks report their end)."""
        now, wall = time.monotonic(), time.time()
        with self._lock:
            entry = self._open.get(message_id)
            if entry is None:
                return
            if self._callbacks_end and not entry[1]:
                entry[3] = 1.0
                return
            self._finish(message_id, now, wall)

    def _finish(self, message_id: str, done: float, done_wall: float) -> None:
        """Move an open message to the finished ones; the caller holds the lock."""
        start, end, publish_wall, _ = self._open.pop(message_id)
        self._finished.append([message_id, start, end or done, done, publish_wall, done_wall])

    def settled(self, message_id: str, outcome: str, answer: str | None) -> None:
        """The wrapper carried an outcome out; only an answered ack finishes the message."""
        with self._lock:
            self.outcomes[outcome] += 1
            if outcome in _ACKING and answer != "SUCCESS":
                self.ack_failures += 1
        if outcome in _ACKING and answer == "SUCCESS":
            self.acked(message_id)
        elif outcome not in _ACKING:
            with self._lock:
                self._open.pop(message_id, None)  # it comes back as a new delivery

    def take(self) -> list[list[Any]]:
        with self._lock:
            out, self._finished = self._finished, []
            return out


class _WarningCounter(logging.Handler):
    """Counts the stock client's warnings by message (they cost CPU: most carry a traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[str(record.msg)[:80]] += 1


CLIENT_WARNINGS = _WarningCounter()
logging.getLogger("google.cloud.pubsub_v1").addHandler(CLIENT_WARNINGS)


class _Capturing(pubsub_v1.SubscriberClient):  # type: ignore[misc]
    """A subscriber that keeps the future of its last ``subscribe``, to read its load."""

    future: Any = None

    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        future = super().subscribe(*args, **kwargs)
        self.future = future
        return future


def _leased(subscriber: _Capturing) -> int:
    """Messages the client holds right now (received, not yet settled): its leaser's count.

    Privates of the stock client (the future keeps its manager name-mangled),
    read for the report only; 0 if they moved.
    """
    manager = getattr(subscriber.future, "_StreamingPullFuture__manager", None)
    leaser = getattr(manager, "leaser", None)
    return int(getattr(leaser, "message_count", 0) or 0)


_OUT_LOCK = threading.Lock()  # one JSON object per line, whichever thread writes


def _emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}) + "\n"
    with _OUT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory_mb(field: str) -> float:
    """``VmHWM`` (peak) or ``VmRSS`` (now) of this process, MB.

    Not ``ru_maxrss``: Linux carries that over from the parent across fork
    and exec, so a consumer would report the orchestrator's size.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError):
        pass
    return 0.0


def _peak_rss_mb() -> float:
    return _memory_mb("VmHWM")


def _firestore_client(project: str, counter: RpcCounter) -> Any:
    from google.cloud import firestore  # noqa: PLC0415 - only the wrapped scenarios pay for it

    client = firestore.Client(project=project)
    make_channel: Callable[[Any], grpc.Channel] = client._emulator_channel

    def counted(transport: Any) -> grpc.Channel:
        return counter.intercept(make_channel(transport))

    # Every Firestore RPC goes through the counter (the channel is made on first use).
    client._emulator_channel = counted  # type: ignore[method-assign]
    return client


class _Consumer:
    """The clients, the callback under test and the subscription, for one process."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self.scenario: Scenario = SCENARIOS[config.scenario]
        self.recorder = _Recorder(callbacks_end=self.scenario.kind != "run")
        self.pubsub_counter = RpcCounter()
        self.firestore_counter = RpcCounter()
        host = os.environ["PUBSUB_EMULATOR_HOST"]
        channel = self.pubsub_counter.intercept(
            grpc.insecure_channel(host, options=_CHANNEL_OPTIONS)
        )
        self.subscriber = _Capturing(transport=SubscriberGrpcTransport(channel=channel))
        self.subscriber.get_subscription(request={"subscription": config.subscription}, timeout=30)
        self.wrapped: Any = None
        self.callback = self._build()
        self._leased_peak = 0
        self._lock = threading.Lock()  # guards _leased_peak

    def _build(self) -> Callable[[Message], None]:
        recorder, kind = self.recorder, self.scenario.kind
        if kind in ("stock-ack", "stock-eod"):

            def stock(message: Message) -> None:
                recorder.started(message.message_id, message.publish_time.timestamp())
                if kind == "stock-ack":
                    message.ack()
                else:
                    message.ack_with_response().result(timeout=60)
                recorder.ended(message.message_id)
                recorder.acked(message.message_id)

            return stock
        from benchmarks.handlers import build_wrapped  # noqa: PLC0415
        from pubsub_worker import Hooks  # noqa: PLC0415

        in_run = kind == "run"

        class BenchHooks(Hooks):
            def received(self, message_id: str) -> None:
                if in_run:  # run() owns the callback: its start is the wrapper's first hook
                    recorder.started(message_id, None)

            def before_ack(self, key: str | None, message_id: str) -> None:
                if in_run:
                    recorder.ended(message_id)

            def settled(self, message_id: str, outcome: str, answer: str | None) -> None:
                recorder.settled(message_id, outcome, answer)

        config = self.config
        self.wrapped = build_wrapped(
            self.scenario,
            subscription=config.subscription,
            project=config.project,
            collection=config.collection,
            firestore_client=_firestore_client(config.project, self.firestore_counter),
            subscriber=self.subscriber,
            hooks=BenchHooks(),
            note=recorder.noted if in_run else None,
        )
        wrapped = self.wrapped

        def timed(message: Message) -> None:
            recorder.started(message.message_id, message.publish_time.timestamp())
            try:
                wrapped(message)
            finally:
                recorder.ended(message.message_id)

        return timed

    def subscribe(self) -> None:
        """Start consuming, the way the scenario says."""
        scenario, config = self.scenario, self.config
        if scenario.subscribe == "run":
            import pubsub_worker  # noqa: PLC0415

            thread = threading.Thread(
                target=pubsub_worker.run,
                args=(self.wrapped,),
                kwargs={
                    "settings": self.wrapped.settings,
                    "subscriber": self.subscriber,
                    "stop": threading.Event(),
                },
                name="bench-run",
                daemon=True,
            )
            thread.start()
        elif scenario.subscribe == "default":
            self.subscriber.subscribe(config.subscription, callback=self.callback)
        else:
            size = scenario.in_flight(config.concurrency)
            executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="bench")
            self.subscriber.subscribe(
                config.subscription,
                callback=self.callback,
                flow_control=pubsub_v1.types.FlowControl(max_messages=size),
                scheduler=ThreadScheduler(executor),
            )

    def flush_forever(self) -> None:
        """Every 50 ms: the messages finished since, and how many the client holds.

        With nothing finished it still reports once a second, so that a stall
        shows what the client holds.
        """
        last = 0.0
        while True:
            time.sleep(_FLUSH_S)
            leased = _leased(self.subscriber)
            if self.wrapped is not None and self.scenario.subscribe == "run":
                leased = max(leased, self.wrapped.in_flight())
            with self._lock:
                self._leased_peak = max(self._leased_peak, leased)
            done = self.recorder.take()
            if done or time.monotonic() - last >= 1.0:
                last = time.monotonic()
                _emit(
                    "progress",
                    done=done,
                    leased=leased,
                    callbacks=self.recorder.callbacks,
                    ack_failures=self.recorder.ack_failures,
                )

    def mark(self, name: str) -> None:
        """The counters now; the orchestrator takes differences between marks."""
        with self._lock:
            peak, self._leased_peak = self._leased_peak, 0
        _emit(
            "mark",
            name=name,
            at=time.monotonic(),
            cpu_s=_cpu_s(),
            pubsub=self.pubsub_counter.snapshot(),
            firestore=self.firestore_counter.snapshot(),
            peak_rss_mb=_peak_rss_mb(),
            leased_peak=peak,
            threads=thread_cpu_s(),
            switches=thread_switches(),
        )

    def result(self) -> None:
        metrics = self.wrapped.metrics.snapshot() if self.wrapped is not None else {}
        _emit(
            "result",
            metrics=metrics,
            callbacks=self.recorder.callbacks,
            ack_failures=self.recorder.ack_failures,
            outcomes=dict(self.recorder.outcomes),
            client_warnings=dict(CLIENT_WARNINGS.counts),
            peak_rss_mb=_peak_rss_mb(),
        )


def run(config: ConsumerConfig) -> None:
    """Serve the protocol of the module docstring until ``exit`` or end of input."""
    consumer = _Consumer(config)
    _emit(
        "ready", rss_mb=_memory_mb("VmRSS"), pid=os.getpid(), cpus=sorted(os.sched_getaffinity(0))
    )
    for raw in sys.stdin:
        command = raw.strip()
        if command == "go":
            consumer.mark("start")
            consumer.subscribe()
            threading.Thread(target=consumer.flush_forever, name="bench-flush", daemon=True).start()
        elif command.startswith("mark "):
            consumer.mark(command.removeprefix("mark "))
        elif command == "exit":
            consumer.result()
            return


def main(argv: list[str] | None = None) -> int:
    """Entry point: one JSON argument, the :class:`ConsumerConfig`."""
    args = sys.argv[1:] if argv is None else argv
    pin_self_from_env()  # before any client starts a thread
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    run(ConsumerConfig(**json.loads(args[0])))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # do not wait on the clients' background threads
