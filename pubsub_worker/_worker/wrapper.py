"""``exactly_once``: wrap a subscriber callback so each job's effects happen once.

Order of operations for one delivery (see ``docs/architecture.md``)::

    receive ─► watch the lease ─► derive key ─► wait for the key in this process ─► claim
        ─► publish unsent outbox entries of earlier owners ─► attempts left? ─► handler
        ─► conclude: decide the outcome (pure), write what it needs, settle on Pub/Sub

This module holds the worker's lifecycle and the handler; one delivery's
path is :class:`~pubsub_worker._worker.flow.DeliveryFlow`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore
from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._job.async_job import AsyncJob, EventLoopThread, flush_queued
from pubsub_worker._job.job import Job, JobCore
from pubsub_worker._support import clients
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Counter, Metrics
from pubsub_worker.errors import ShuttingDown
from pubsub_worker.hooks import Hooks
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import JobStore

from . import runtime
from .flow import DeliveryFlow
from .handler import check_handler, is_async, sync, takes_job
from .legacy import DeferredMessageProxy, MessageProxy
from .outcome import Decision, Happened, Outcome, Phase, backoff_s
from .runtime import Runtime
from .settle import settle

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ExactlyOnce", "Handler", "Options", "RunOptions", "exactly_once"]

_LOGGER = logging.getLogger("pubsub_worker")

_MAX_RECEIPTS = 100_000

Handler = Callable[..., Any]


class RunOptions(TypedDict, total=False):
    """What ``run()`` passes on to :func:`exactly_once` (its own settings and subscriber too)."""

    firestore_client: firestore.Client | None
    publisher: pubsub_v1.PublisherClient | None
    store: JobStore | None
    """The job store; a batching Firestore store on ``firestore_client`` when not given."""
    hooks: Hooks | None


class Options(RunOptions, total=False):
    """What :class:`ExactlyOnce` and :func:`exactly_once` take besides the handler."""

    settings: Settings | None
    """Read from the environment at :meth:`ExactlyOnce.start` when not given."""
    subscriber: pubsub_v1.SubscriberClient | None
    """Used for the start-up check of the subscription."""


class ExactlyOnce:
    """A Pub/Sub callback that runs ``handler`` at most once per job epoch, to completion once.

    Pass it wherever a ``callback(message)`` goes (``subscriber.subscribe``)
    or to :func:`pubsub_worker.run`. ``handler`` is either
    ``handler(message, job)`` (steps through ``job``; returning means done) or
    an existing ``handler(message)`` that calls ``message.ack()`` /
    ``message.nack()``, which are intercepted: ack records the completion
    and then acks, nack releases the job for a retry. Either may be an
    ``async def``: it then runs on the worker's event loop with an
    :class:`~pubsub_worker._job.async_job.AsyncJob` (``await job.step(...)``).

    Nothing is read from the environment until :meth:`start` or the first
    message; call :meth:`start` yourself to fail fast on bad settings.
    """

    def __init__(self, handler: Handler, **options: Unpack[Options]) -> None:
        check_handler(handler)
        self._handler = handler
        self._legacy = not takes_job(handler)
        self._async = is_async(handler)
        self._loop = EventLoopThread()
        self._settings = options.get("settings")
        self._firestore_client = options.get("firestore_client")
        self._publisher = options.get("publisher")
        self._store = options.get("store")
        self._subscriber = options.get("subscriber")
        self._hooks = options.get("hooks") or Hooks()
        self._lock = threading.Lock()  # guards _runtime
        self._runtime: Runtime | None = None
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._closed = False  # close() ran; a start() after it begins a new run
        self._receipts: dict[str, float] = {}  # ack id -> monotonic receipt time
        self.__wrapped__ = handler
        self.__name__ = getattr(handler, "__name__", type(self).__name__)
        self.__doc__ = getattr(handler, "__doc__", None)

    # -- lifecycle ----------------------------------------------------------------

    def start(
        self,
        settings: Settings | None = None,
        *,
        check_subscription: bool = True,
        conclude_off_thread: bool = False,
        concluding_threads: int | None = None,
    ) -> None:
        """Read settings, build clients, check the subscription; idempotent.

        ``conclude_off_thread``: a job-style handler that returned is concluded
        (the completion's write, then the ack) off its callback thread, which
        takes the next message meanwhile. Only for a caller that calls
        :meth:`drain` before it closes the subscriber's stream, as
        :func:`pubsub_worker.run` does: otherwise a conclusion could send its
        ack after the client's dispatcher stopped. Without it, a callback
        returns once its message is settled, as with the stock client.
        ``concluding_threads``: how many conclusions run at once off the
        callback threads; by default ``MAX_MESSAGES``. Give the flow control's
        ``max_messages``: every admitted message may be a finished job waiting
        for its conclusion (threads are started only as that many are busy).

        Raises :class:`~pubsub_worker.errors.ConfigError` for bad settings, a
        subscription without exactly-once delivery (unless
        ``ALLOW_AT_LEAST_ONCE``) or a missing failure topic, and
        :class:`~pubsub_worker.errors.Unreachable` when Pub/Sub or Firestore
        does not answer.
        """
        with self._lock:
            if self._runtime is None:
                settings = settings or self._settings or Settings.from_env()
                if self._publisher is None:
                    self._publisher = clients.publisher_client(settings)
                self._runtime = runtime.build(
                    settings,
                    store=self._store,
                    firestore_client=self._firestore_client,
                    publisher=self._publisher,
                    hooks=self._hooks,
                    stopping=self._stopping,
                    draining=self._draining,
                )
            elif self._closed or self._draining.is_set():  # started again: a new run
                self._stopping.clear()
                self._draining.clear()
            self._closed = False
            rt = self._runtime
            if conclude_off_thread:
                rt.completer.reopen(concluding_threads)
            if check_subscription and not rt.checked:
                subscriber = self._subscriber or clients.subscriber_client(rt.settings)
                try:
                    runtime.check_subscription(rt.settings, subscriber)
                finally:
                    if self._subscriber is None:
                        subscriber.close()
                runtime.check_failure_topic(rt.settings, self._publisher)
                rt.checked = True
            rt.keeper.start()

    def close(self) -> None:
        """Stop the lease keeper and the event loop. In-flight callbacks should have ended.

        The conclusions under way (completion writes, then acks) are waited for first.
        """
        with self._lock:
            rt = self._runtime
            self._closed = True
        if rt is not None:
            rt.completer.close()
            rt.keeper.stop()
        self._loop.stop()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking jobs; conclude on callback threads; wait for those handed off.

        From now on a delivery that has not claimed its job is nacked without
        a claim (the next worker takes it, nothing is written), and every
        later conclusion happens on its own callback thread. Waits for the
        conclusions handed to the completer and for the messages an existing
        callback handed to its own threads (until their ``ack()``/``nack()``).
        Call this before cancelling the subscriber's streaming-pull future, so
        that every ack is sent before the stream closes;
        :func:`pubsub_worker.run` does. False if ``timeout_s`` passed with
        conclusions still under way. A later :meth:`start` takes jobs again.
        """
        self._draining.set()
        rt = self._runtime
        return True if rt is None else rt.completer.close(timeout_s)

    def wait_concluded(self, timeout_s: float | None = None) -> bool:
        """Wait until the deliveries handed off so far are concluded (acked, nacked...)."""
        rt = self._runtime
        return True if rt is None else rt.completer.wait(timeout_s)

    def stop_jobs(self) -> None:
        """Ask in-flight jobs to stop at their next boundary; they are released, not acked.

        An ``async def`` handler's task is cancelled too: awaiting a long call,
        it may be nowhere near a boundary. Its job is released, the attempt
        given back, as for any stop.
        """
        self._stopping.set()
        self._loop.cancel_running()

    @property
    def settings(self) -> Settings:
        """The settings in use (after :meth:`start` or the first message)."""
        return self._ensure().settings

    @property
    def metrics(self) -> Metrics:
        """Counters and gauges of this worker."""
        return self._ensure().metrics

    def in_flight(self) -> int:
        """Jobs being processed right now."""
        return 0 if self._runtime is None else self._runtime.keeper.in_flight()

    def received(self, message: Message) -> None:
        """Note that ``message`` was received: its processing time counts from now.

        :func:`pubsub_worker.run` calls it from its scheduler, before the
        message waits for a thread. Without it the time counts from the call.
        """
        if len(self._receipts) < _MAX_RECEIPTS:
            self._receipts[message.ack_id] = time.monotonic()

    def _ensure(self) -> Runtime:
        if self._runtime is None:
            self.start()
        assert self._runtime is not None
        return self._runtime

    # -- one delivery -------------------------------------------------------------

    def __call__(self, message: Message) -> None:
        """Handle one delivery; never raises (errors are logged, the message kept or deferred)."""
        received_at = self._receipts.pop(message.ack_id, None) or time.monotonic()
        log = job_logger(_LOGGER, "?", message.message_id)
        try:
            rt = self._ensure()
        except Exception as exc:
            log.exception("worker cannot start; the message comes back later")
            decision = Decision(Outcome.DEFER, str(exc), delay_s=backoff_s(1))
            settle(decision, message, metrics=Metrics(), log=log)
            return
        rt.hooks.received(message.message_id)
        rt.metrics.inc(Counter.RECEIVED)
        seen = rt.tracker.seen(message.message_id)
        delivery = rt.tracker.register(message.message_id, message.ack_id)
        ticket = rt.keeper.watch(
            message,
            delivery,
            received_at=received_at,
            published_at=message.publish_time.timestamp(),
        )
        handling = DeliveryFlow(rt, message, delivery, ticket, log, self.call_handler)
        try:
            handling.run(seen)
        except Exception as exc:
            log.exception("unexpected error")
            if not handling.detached:
                handling.conclude(Happened(Phase.RUN, error=exc))
        finally:
            handling.end()

    def call_handler(self, message: Message, job: JobCore, flow: DeliveryFlow) -> None:
        """Run the wrapped handler for a claimed job and conclude the delivery.

        A job-style handler that returned is concluded on the completer
        (``flow.conclude_later``); a failure here. A callback-style handler
        concludes through its message's ``ack()``/``nack()``, here or from its
        own threads later (:mod:`pubsub_worker._worker.legacy`).
        """
        log = job_logger(_LOGGER, job.key, job.message_id)
        proxy, call = self._prepare(message, job, flow, log)
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - user code: its failure is an outcome
            error = _cancelled_is_shutdown(exc) if self._async else exc
            if proxy is not None:
                proxy.finish(error)
                return
            job.handler_returned()
            flow.conclude(Happened(Phase.RUN, error=error))
            return
        if proxy is not None:
            proxy.finish(None)
            return
        job.handler_returned()
        flow.conclude_later(Happened(Phase.RUN))

    def _prepare(
        self, message: Message, job: JobCore, flow: DeliveryFlow, log: logging.LoggerAdapter[Any]
    ) -> tuple[MessageProxy | None, Callable[[], None]]:
        """The call that runs the handler, and the proxy concluding a callback-style one.

        An ``async def`` handler runs on the worker's loop while this thread waits.
        """
        if not self._async:
            if self._legacy:
                proxy = MessageProxy(message, job, flow, log, face=Job(job))
                return proxy, lambda: sync(self._handler(proxy))
            return None, lambda: sync(self._handler(message, Job(job)))
        ajob = AsyncJob(job, self._loop.io)
        if self._legacy:
            deferred = DeferredMessageProxy(
                message, job, flow, log, face=ajob, queued=job.take_deferred, io=self._loop.io
            )
            return deferred, lambda: self._loop.run(_awaited(self._handler(deferred)))
        return None, lambda: self._loop.run(_job_done(self._handler(message, ajob), ajob))


def exactly_once(handler: Handler | None = None, **options: Unpack[Options]) -> Any:
    """Wrap a callback for exactly-once processing; usable bare or with arguments.

    ``@exactly_once`` or ``@exactly_once(settings=..., firestore_client=...)``.
    Returns an :class:`ExactlyOnce`, which takes ``(message)`` like any
    Pub/Sub callback.
    """

    def wrap(fn: Handler) -> ExactlyOnce:
        return ExactlyOnce(fn, **options)

    return wrap(handler) if handler is not None else wrap


def _cancelled_is_shutdown(error: Exception) -> Exception:
    """A handler's task cancelled (the worker's loop stopping) is a shutdown, not a failure."""
    if isinstance(error, concurrent.futures.CancelledError):
        return ShuttingDown("the worker stopped while the handler ran")
    return error


async def _awaited(result: Any) -> None:
    await result


async def _job_done(result: Any, job: AsyncJob) -> None:
    await result
    await flush_queued(job)  # publishes outside any step are steps: committed before completion
