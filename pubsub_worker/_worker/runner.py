"""``run()``: a blocking worker with the lease settings, flow control and shutdown done right.

:func:`run` is one worker process. :func:`supervise` is ``pubsub-worker run
--processes N``: N such processes on one subscription, for a handler that
one process's GIL holds back. It forwards SIGTERM and SIGINT to them and
restarts none: a process that dies is logged, the others are stopped like
on SIGTERM, and the supervisor exits non-zero.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import google.cloud.pubsub_v1 as pubsub_v1
from google.api_core import exceptions as gexc
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

from pubsub_worker._support import client_logs, clients, idle
from pubsub_worker.settings import Settings

from .serve import DEFAULT_HOST, Health, MetricsServer
from .wrapper import ExactlyOnce, Handler, RunOptions, exactly_once

if TYPE_CHECKING:
    from typing_extensions import Unpack

Callback = Callable[[], None]

__all__ = ["ReceiptScheduler", "flow_control", "run", "supervise"]

_LOGGER = logging.getLogger("pubsub_worker")

_AFTER_GRACE_S = 10.0
"""After the grace period, how long released jobs get to reach their next boundary."""


def flow_control(settings: Settings) -> pubsub_v1.types.FlowControl:
    """Flow control for a worker: ``MAX_MESSAGES`` + ``PREFETCH_MESSAGES`` in hand.

    The client holds a message's flow-control slot until its ack is answered
    (or it is nacked or dropped), up to the processing cap plus a lease
    (``max_lease_duration``). ``MAX_MESSAGES`` threads run jobs; the
    prefetched messages wait for a thread, leased, or are finished jobs whose
    ack is in flight: without them a thread would wait for a slot that an
    answered-soon ack holds (at most ``MAX_MESSAGES`` prefetched, so that a
    message waits for one job at most; its cap runs meanwhile). Progress is
    enforced by the wrapper's lease keeper: a running job that shows none for
    a lease is given up (dropped from the client's lease management) and
    Pub/Sub redelivers it; a job past the cap is abandoned.
    """
    return pubsub_v1.types.FlowControl(
        max_messages=settings.admitted_messages,
        max_lease_duration=settings.max_processing_seconds + settings.lease_seconds,
        min_duration_per_lease_extension=settings.lease_seconds,
        max_duration_per_lease_extension=settings.lease_seconds,
    )


class ReceiptScheduler(ThreadScheduler):  # type: ignore[misc]
    """The client's thread scheduler, telling the wrapper when each message arrived.

    A message scheduled while every thread is busy waits in the executor's
    queue; its processing time (and the cap) counts from here, not from when
    a thread picks it up.
    """

    def __init__(self, executor: ThreadPoolExecutor, wrapped: ExactlyOnce) -> None:
        super().__init__(executor)
        self._wrapped = wrapped

    def schedule(self, callback: Any, *args: Any, **kwargs: Any) -> None:
        """Note the receipt of the message, then queue its callback."""
        if args:
            self._wrapped.received(args[0])
        super().schedule(callback, *args, **kwargs)


def run(
    handler: Handler,
    *,
    settings: Settings | None = None,
    subscriber: pubsub_v1.SubscriberClient | None = None,
    stop: threading.Event | None = None,
    metrics_port: int | None = None,
    metrics_host: str = DEFAULT_HOST,
    **options: Unpack[RunOptions],
) -> int:
    """Consume the configured subscription until SIGTERM/SIGINT (or ``stop`` is set).

    Settings come from the environment unless given. On a stop signal the
    worker stops pulling, lets in-flight jobs run for
    ``SHUTDOWN_GRACE_SECONDS``, then asks them to stop at their next step
    boundary; a job that did not finish is released for another worker and
    never acked. Returns 0 after a requested stop; raises
    :class:`~pubsub_worker.errors.ConfigError` or
    :class:`~pubsub_worker.errors.Unreachable` at start-up.

    With ``metrics_port`` the worker serves ``/metrics``, ``/livez`` and
    ``/readyz`` on ``metrics_host:metrics_port`` from before its start-up
    checks until it has stopped (:mod:`pubsub_worker._worker.serve`; 0 picks a free
    port and logs it); readiness follows the streaming pull future. ``options``
    are :func:`~pubsub_worker.exactly_once`'s, for a handler not wrapped yet.
    """
    settings = settings or Settings.from_env()
    subscriber = subscriber or clients.subscriber_client(settings)
    wrapped = (
        handler
        if isinstance(handler, ExactlyOnce)
        else exactly_once(handler, settings=settings, subscriber=subscriber, **options)
    )
    endpoint = _endpoint(metrics_port, metrics_host)
    try:
        return _consume(wrapped, settings, subscriber, stop, endpoint)
    finally:
        if endpoint is not None:
            endpoint.stop()


def _endpoint(port: int | None, host: str) -> MetricsServer | None:
    """The started metrics and health endpoint, or None when no port was asked for."""
    if port is None:
        return None
    endpoint = MetricsServer(Health(), port=port, host=host)
    endpoint.start()
    return endpoint


def _consume(
    wrapped: ExactlyOnce,
    settings: Settings,
    subscriber: pubsub_v1.SubscriberClient,
    stop: threading.Event | None,
    endpoint: MetricsServer | None,
) -> int:
    # Drained below, before the stream closes; a conclusion for every message admitted.
    wrapped.start(settings, conclude_off_thread=True, concluding_threads=settings.admitted_messages)
    client_logs.install(wrapped.metrics)  # the stock client's refused modacks: a counted line
    stop = stop or threading.Event()
    restore = _on_stop_signals(stop)
    executor = ThreadPoolExecutor(
        max_workers=settings.max_messages, thread_name_prefix="pubsub-worker"
    )
    streams = [
        subscriber.subscribe(
            path,
            callback=wrapped,
            flow_control=flow_control(settings),
            scheduler=ReceiptScheduler(executor, wrapped),
            await_callbacks_on_shutdown=True,
        )
        for path in (settings.subscription_path, *_replays(settings, subscriber))
    ]
    streaming = streams[0]
    if endpoint is not None:
        endpoint.metrics = wrapped.metrics
        endpoint.health.running(cast("Future[Any]", streaming))
    _LOGGER.info(
        "consuming %s (lease %d s, cap %d s, %d at once, %d admitted)",
        settings.subscription_path,
        settings.lease_seconds,
        settings.max_processing_seconds,
        settings.max_messages,
        settings.admitted_messages,
    )
    reporter = idle.report_idle(settings, wrapped.metrics, wrapped.in_flight)  # "idle: ..." lines
    try:
        while not stop.wait(0.5):
            for stream in streams:
                if stream.done():  # the stream failed for good
                    stream.result()
    finally:
        reporter.stop()
        if endpoint is not None:
            endpoint.health.stopping()
        restore()
        _shutdown(wrapped, streams, settings)
        subscriber.close()
    return 0


def _replays(settings: Settings, subscriber: pubsub_v1.SubscriberClient) -> list[str]:
    """The replay subscription, consumed beside the worker's own when it exists."""
    path = settings.replay_subscription_path
    try:
        subscriber.get_subscription(request={"subscription": path}, timeout=10.0)
    except gexc.NotFound:
        _LOGGER.info(
            "no replay subscription %s: `pubsub-worker jobs replay` refuses until "
            "`pubsub-worker jobs replay-setup` makes it",
            path,
        )
        return []
    _LOGGER.info("consuming the replays of failed jobs too, from %s", path)
    return [path]


def _shutdown(wrapped: ExactlyOnce, streams: list[Any], settings: Settings) -> None:
    """The engine's shutdown, with the streams closed once every ack is sent."""
    engine = wrapped.engine
    grace = settings.shutdown_grace_seconds
    _LOGGER.info("stopping: no new messages; %d in flight get %.0f s", wrapped.in_flight(), grace)
    engine.begin_shutdown(grace)  # nothing more is claimed; past the grace, jobs stop
    # Acks must be sent before the stream closes: from now on each callback concludes its
    # own delivery, and the conclusions already handed off are waited for.
    if not wrapped.drain(grace):
        _LOGGER.warning("conclusions still under way after %.0f s", grace)
    for streaming in streams:
        streaming.cancel()  # stops pulling; waits for callbacks (they still ack) before closing
    for streaming in streams:
        try:
            streaming.result(timeout=grace + _AFTER_GRACE_S)
        except Exception as exc:  # noqa: BLE001 - shutdown goes on whatever the stream says
            _LOGGER.warning("subscriber did not close cleanly: %s", exc)
    engine.finish_shutdown(timeout_s=1.0)


def _on_stop_signals(stop: threading.Event, received: list[int] | None = None) -> Callback:
    """SIGTERM/SIGINT set ``stop`` (and are appended to ``received``); returns the undoing.

    Only the main thread can install signal handlers: elsewhere nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        _LOGGER.info("received %s", signal.Signals(signum).name)
        if received is not None:
            received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


# -- several processes ----------------------------------------------------------------

_SUPERVISE_POLL_S = 0.2


def supervise(
    commands: Sequence[Sequence[str]],
    *,
    stop_timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run one worker process per command until SIGTERM/SIGINT; restart none of them.

    A stop signal is forwarded to every process, which stops like a single
    worker does (in-flight jobs get the grace period, unfinished ones are
    released). A process that exits without a stop request is logged, the
    others get SIGTERM, and the supervisor exits non-zero: a crashing worker
    is never restarted silently. A process still running ``stop_timeout_s``
    after it was told to stop is killed (its jobs come back after their
    lease). Returns 0 when a requested stop ended every process with 0;
    otherwise the dead process's exit code (1 if it died of a signal) or 1.
    """
    received: list[int] = []
    stop = threading.Event()
    restore = _on_stop_signals(stop, received)  # forwarded to the processes as the same signal
    children: list[subprocess.Popen[bytes]] = []
    try:
        for index, command in enumerate(commands, start=1):
            child = subprocess.Popen(list(command), env=dict(env) if env is not None else None)
            children.append(child)
            _LOGGER.info(
                "worker process %d of %d started (pid %d)", index, len(commands), child.pid
            )
        dead = _wait_for_stop_or_death(children, stop)
        if dead is not None:
            index, child = dead
            _LOGGER.error(
                "worker process %d (pid %d) exited with %s without a stop request; "
                "stopping the others (none is restarted)",
                index,
                child.pid,
                _exit_text(child.returncode),
            )
            _stop(children, signal.SIGTERM, stop_timeout_s)
            return child.returncode if child.returncode > 0 else 1
        signum = received[-1] if received else signal.SIGTERM
        codes = _stop(children, signum, stop_timeout_s)
    finally:
        restore()
        for child in children:  # only if something above raised: never leave one behind
            if child.poll() is None:
                child.kill()
                child.wait()
    failed = {pid: code for pid, code in codes.items() if code != 0}
    if failed:
        _LOGGER.error(
            "%d worker process(es) did not stop cleanly: %s",
            len(failed),
            ", ".join(f"pid {pid} {_exit_text(code)}" for pid, code in failed.items()),
        )
        return 1
    _LOGGER.info("all %d worker processes stopped", len(children))
    return 0


def _wait_for_stop_or_death(
    children: list[subprocess.Popen[bytes]], stop: threading.Event
) -> tuple[int, subprocess.Popen[bytes]] | None:
    """Wait for a stop request (None) or a process that exits first (its number and itself)."""
    while not stop.wait(_SUPERVISE_POLL_S):
        for index, child in enumerate(children, start=1):
            if child.poll() is not None:
                return index, child
    return None


def _stop(children: list[subprocess.Popen[bytes]], signum: int, timeout_s: float) -> dict[int, int]:
    """Send ``signum`` to every running process, wait up to ``timeout_s``, kill the rest."""
    running = [child for child in children if child.poll() is None]
    if running:
        _LOGGER.info(
            "forwarding %s to %d worker process(es)", signal.Signals(signum).name, len(running)
        )
    for child in running:
        child.send_signal(signum)
    deadline = time.monotonic() + timeout_s
    for child in running:
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            _LOGGER.warning(
                "worker process pid %d still running %.0f s after %s; killing it",
                child.pid,
                timeout_s,
                signal.Signals(signum).name,
            )
            child.kill()
            child.wait()
    return {child.pid: child.returncode for child in children}


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
