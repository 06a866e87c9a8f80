"""``run()``: a blocking worker with the lease settings, flow control and shutdown done right."""

from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

from . import clients
from .settings import Settings
from .wrapper import ExactlyOnce, Handler, exactly_once

__all__ = ["ReceiptScheduler", "flow_control", "run"]

_LOGGER = logging.getLogger("pubsub_worker")

_AFTER_GRACE_S = 10.0
"""After the grace period, how long released jobs get to reach their next boundary."""


def flow_control(settings: Settings) -> pubsub_v1.types.FlowControl:
    """Flow control for a worker: ``MAX_MESSAGES`` in flight, each extension one lease.

    The client holds a message's flow-control slot until the wrapper settles
    it, up to the processing cap plus a lease (``max_lease_duration``), so
    no more than ``MAX_MESSAGES`` callbacks run or wait for a thread at
    once, and a message waiting for its turn keeps its lease. Progress is
    enforced by the wrapper's lease keeper: a running job that shows none for
    a lease is given up (dropped from the client's lease management) and
    Pub/Sub redelivers it; a job past the cap is abandoned.
    """
    return pubsub_v1.types.FlowControl(
        max_messages=settings.max_messages,
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
    **wrapper_options: Any,
) -> int:
    """Consume the configured subscription until SIGTERM/SIGINT (or ``stop`` is set).

    Settings come from the environment unless given. On a stop signal the
    worker stops pulling, lets in-flight jobs run for
    ``SHUTDOWN_GRACE_SECONDS``, then asks them to stop at their next step
    boundary; a job that did not finish is released for another worker and
    never acked. Returns 0 after a requested stop; raises
    :class:`~pubsub_worker.errors.ConfigError` or
    :class:`~pubsub_worker.errors.Unreachable` at start-up.
    """
    settings = settings or Settings.from_env()
    subscriber = subscriber or clients.subscriber_client(settings)
    wrapped = (
        handler
        if isinstance(handler, ExactlyOnce)
        else exactly_once(handler, settings=settings, subscriber=subscriber, **wrapper_options)
    )
    wrapped.start(settings)
    stop = stop or threading.Event()
    restore = _install_signal_handlers(stop)
    executor = ThreadPoolExecutor(
        max_workers=settings.max_messages, thread_name_prefix="pubsub-worker"
    )
    streaming = subscriber.subscribe(
        settings.subscription_path,
        callback=wrapped,
        flow_control=flow_control(settings),
        scheduler=ReceiptScheduler(executor, wrapped),
        await_callbacks_on_shutdown=True,
    )
    _LOGGER.info(
        "consuming %s (lease %d s, cap %d s, %d in flight)",
        settings.subscription_path,
        settings.lease_seconds,
        settings.max_processing_seconds,
        settings.max_messages,
    )
    try:
        while not stop.wait(0.5):
            if streaming.done():  # the stream failed for good
                streaming.result()
    finally:
        restore()
        _shutdown(wrapped, streaming, settings)
        subscriber.close()
    return 0


def _shutdown(wrapped: ExactlyOnce, streaming: Any, settings: Settings) -> None:
    grace = settings.shutdown_grace_seconds
    _LOGGER.info("stopping: no new messages; %d in flight get %.0f s", wrapped.in_flight(), grace)
    timer = threading.Timer(grace, wrapped.stop_jobs)
    timer.daemon = True
    timer.start()
    streaming.cancel()  # stops pulling; waits for callbacks (they still ack) before closing
    try:
        streaming.result(timeout=grace + _AFTER_GRACE_S)
    except Exception as exc:  # noqa: BLE001 - shutdown goes on whatever the stream says
        _LOGGER.warning("subscriber did not close cleanly: %s", exc)
    timer.cancel()
    deadline = time.monotonic() + 1.0
    while wrapped.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    if wrapped.in_flight():
        _LOGGER.warning("%d job(s) still running after the grace period", wrapped.in_flight())
    wrapped.close()


def _install_signal_handlers(stop: threading.Event) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        _LOGGER.info("received %s", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
