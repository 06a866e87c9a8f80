"""One consumer run, in its own process: ``python -m benchmarks.consumer CONFIG_JSON``.

The orchestrator (:mod:`benchmarks.run`) starts one of these per scenario and
repeat, so the peak RSS and CPU time measured here are this consumer's own.
Protocol, one JSON object per line on stdout::

    -> {"event": "ready"}        clients built and warmed; waiting for "go" on stdin
    <- go
    -> {"event": "drained", ...} the backlog is processed (throughput phase over)
       (the orchestrator now publishes the paced messages)
    -> {"event": "result", ...}  every message processed; the process exits

Messages carry an attribute ``phase`` (``backlog`` or ``paced``). Only the
first completion of each message id counts; redeliveries are reported.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import grpc
from google.cloud.pubsub_v1.subscriber.message import Message
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler
from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

from benchmarks.counting import RpcCounter
from benchmarks.scenarios import SCENARIOS, Scenario

__all__ = ["ConsumerConfig", "main"]

# The same channel options the library's subscriber uses (large EOD error trailers).
_CHANNEL_OPTIONS = [("grpc.max_metadata_size", 4 * 1024 * 1024)]


@dataclass(frozen=True)
class ConsumerConfig:
    """What one consumer run does."""

    scenario: str
    subscription: str
    project: str
    collection: str
    backlog: int
    paced: int
    concurrency: int
    timeout_s: float


@dataclass
class _Sample:
    phase: str
    publish_wall: float
    start: float
    end: float
    end_wall: float


class _Recorder:
    """Collects one sample per message id; signals when a phase is complete."""

    def __init__(self, backlog: int, paced: int) -> None:
        self._lock = threading.Lock()  # guards everything below
        self._samples: dict[str, _Sample] = {}
        self._wanted = {"backlog": backlog, "paced": paced}
        self._done = {"backlog": 0, "paced": 0}
        self.callbacks = 0
        self.repeats = 0
        self.first_start: float | None = None
        self.last_backlog_end = 0.0
        self.drained = threading.Event()
        self.finished = threading.Event()
        if backlog == 0:
            self.drained.set()
        if paced == 0:
            self.finished.set()

    def started(self, start: float) -> None:
        with self._lock:
            self.callbacks += 1
            if self.first_start is None:
                self.first_start = start

    def record(self, message: Message, start: float) -> None:
        end = time.perf_counter()
        end_wall = time.time()
        phase = message.attributes.get("phase", "backlog")
        publish_wall = message.publish_time.timestamp()
        with self._lock:
            if message.message_id in self._samples:
                self.repeats += 1
                return
            self._samples[message.message_id] = _Sample(phase, publish_wall, start, end, end_wall)
            self._done[phase] += 1
            if phase == "backlog":
                self.last_backlog_end = max(self.last_backlog_end, end)
                if self._done[phase] >= self._wanted[phase]:
                    self.drained.set()
            elif self._done[phase] >= self._wanted[phase]:
                self.finished.set()

    def samples(self, phase: str) -> list[_Sample]:
        with self._lock:
            return [s for s in self._samples.values() if s.phase == phase]

    def done(self) -> dict[str, int]:
        with self._lock:
            return dict(self._done)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "mean": sum(ordered) / len(ordered),
        "p50": pick(0.50),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": ordered[-1],
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _subscriber(host: str, counter: RpcCounter) -> pubsub_v1.SubscriberClient:
    channel = counter.intercept(grpc.insecure_channel(host, options=_CHANNEL_OPTIONS))
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def _firestore_client(project: str, counter: RpcCounter) -> Any:
    from google.cloud import firestore  # noqa: PLC0415 - only the wrapped scenarios pay for it

    client = firestore.Client(project=project)
    make_channel: Callable[[Any], grpc.Channel] = client._emulator_channel

    def counted(transport: Any) -> grpc.Channel:
        return counter.intercept(make_channel(transport))

    # Every Firestore RPC goes through the counter (the channel is made on first use).
    client._emulator_channel = counted  # type: ignore[method-assign]
    return client


def _callback(
    scenario: Scenario,
    config: ConsumerConfig,
    subscriber: pubsub_v1.SubscriberClient,
    firestore_counter: RpcCounter,
) -> tuple[Callable[[Message], None], Any]:
    """The callback under test and, for wrapped scenarios, the ``ExactlyOnce`` object."""
    if scenario.kind == "stock-ack":
        return (lambda message: message.ack()), None
    if scenario.kind == "stock-eod":

        def eod(message: Message) -> None:
            message.ack_with_response().result(timeout=60)

        return eod, None
    from benchmarks.handlers import build_wrapped  # noqa: PLC0415

    client = _firestore_client(config.project, firestore_counter)
    wrapped = build_wrapped(
        scenario,
        subscription=config.subscription,
        project=config.project,
        collection=config.collection,
        concurrency=config.concurrency,
        firestore_client=client,
        subscriber=subscriber,
    )
    return wrapped, wrapped


def run(config: ConsumerConfig) -> None:
    """Run one scenario end to end; see the module docstring for the protocol."""
    scenario = SCENARIOS[config.scenario]
    host = os.environ["PUBSUB_EMULATOR_HOST"]
    pubsub_counter = RpcCounter()
    firestore_counter = RpcCounter()
    subscriber = _subscriber(host, pubsub_counter)
    subscriber.get_subscription(request={"subscription": config.subscription}, timeout=30)
    target, wrapped = _callback(scenario, config, subscriber, firestore_counter)
    recorder = _Recorder(config.backlog, config.paced)

    def callback(message: Message) -> None:
        start = time.perf_counter()
        recorder.started(start)
        target(message)
        recorder.record(message, start)

    rss_ready = _peak_rss_mb()
    _emit("ready", rss_mb=rss_ready)
    if sys.stdin.readline().strip() != "go":
        return

    before = (pubsub_counter.snapshot(), firestore_counter.snapshot(), _cpu_s())
    executor = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="bench")
    started = time.perf_counter()
    streaming = subscriber.subscribe(
        config.subscription,
        callback=callback,
        flow_control=pubsub_v1.types.FlowControl(max_messages=config.concurrency),
        scheduler=ThreadScheduler(executor),
    )
    deadline = started + config.timeout_s
    ok = recorder.drained.wait(max(deadline - time.perf_counter(), 0))
    after = (pubsub_counter.snapshot(), firestore_counter.snapshot(), _cpu_s())
    first = recorder.first_start or started
    elapsed = max(recorder.last_backlog_end - first, 1e-9)
    backlog = recorder.samples("backlog")
    _emit(
        "drained",
        ok=ok,
        done=recorder.done(),
        elapsed_s=elapsed,
        startup_s=first - started,
        msgs_per_s=len(backlog) / elapsed,
        cpu_s=after[2] - before[2],
        pubsub=_delta(before[0], after[0]),
        firestore=_delta(before[1], after[1]),
        service_ms=_percentiles([(s.end - s.start) * 1000 for s in backlog]),
        # Share of the callback slots busy in a callback: below 1, messages came too slowly.
        occupancy=sum(s.end - s.start for s in backlog) / (elapsed * config.concurrency),
    )
    if ok:
        ok = recorder.finished.wait(max(deadline - time.perf_counter(), 0))
    paced = recorder.samples("paced")
    metrics = wrapped.metrics.snapshot() if wrapped is not None else {}
    if wrapped is not None and metrics.get("completed", 0) < config.backlog + config.paced:
        ok = False  # a callback returned without completing its job (nacked, failed, lost)
    _emit(
        "result",
        ok=ok,
        done=recorder.done(),
        callbacks=recorder.callbacks,
        repeats=recorder.repeats,
        latency_ms=_percentiles([(s.end_wall - s.publish_wall) * 1000 for s in paced]),
        paced_service_ms=_percentiles([(s.end - s.start) * 1000 for s in paced]),
        peak_rss_mb=_peak_rss_mb(),
        rss_ready_mb=rss_ready,
        metrics=metrics,
    )
    streaming.cancel()
    try:
        streaming.result(timeout=10)
    except Exception:  # noqa: BLE001, S110 - the measurement is already out
        pass
    if wrapped is not None:
        wrapped.close()
    subscriber.close()


def _delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("calls", "items"):
        out[kind] = {
            name: after[kind].get(name, 0) - before[kind].get(name, 0)
            for name in after[kind]
            if after[kind].get(name, 0) != before[kind].get(name, 0)
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point: one JSON argument, the :class:`ConsumerConfig`."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    config = ConsumerConfig(**json.loads(args[0]))
    run(config)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # do not wait on the clients' background threads
