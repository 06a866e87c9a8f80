"""The delivery engine: one handler, one runtime, every delivery's intake and the lifecycle.

Both doors enter here: the pull worker (:class:`~pubsub_worker.ExactlyOnce`,
a ``callback(message)`` for the stock subscriber, and :func:`~pubsub_worker.run`)
and the push endpoint (:mod:`pubsub_worker.push`). Each is a thin adapter
that holds only what its transport needs (the receipt times of the
subscriber's scheduler; the HTTP request and its answer) and a :class:`Door`
saying what its transport asks of the engine. Everything else is here, once:

* the handler, checked when the engine is made (:mod:`.handler`), and the runtime,
  built at :meth:`Engine.start` from the settings;
* the intake of a delivery (:meth:`Engine.deliver`): registered as the latest delivery
  of its message, its lease watched, its processing cap counted from receipt, then
  :class:`~pubsub_worker._worker.flow.DeliveryFlow`;
* the lifecycle (start, drain, stop, close), the one shutdown sequence
  (:meth:`~Engine.begin_shutdown`: no new claims, one grace, then a stop at the next
  boundary) and the readiness answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore
from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._support import clients
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Counter, Metrics
from pubsub_worker.errors import ConfigError
from pubsub_worker.hooks import Hooks
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import JobStore

from . import runtime
from .flow import DeliveryFlow
from .handler import HandlerCall
from .outcome import Decision, Happened, Outcome, Phase, backoff_s
from .runtime import Runtime
from .settle import settle

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "PULL",
    "Decision",
    "DeliveryFlow",
    "Door",
    "Engine",
    "Options",
    "Outcome",
    "Phase",
    "RunOptions",
]
"""The engine and, for the doors, what they read of a delivery's end (its flow's decision)."""

_LOGGER = logging.getLogger("pubsub_worker")


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


def _same(settings: Settings) -> Settings:
    return settings


@dataclass(frozen=True)
class Door:
    """What a transport asks of the engine."""

    name: str
    """``pull`` or ``push``: for logs."""
    settings_for: Callable[[Settings], Settings] = _same
    """The settings deliveries run with, from the configured ones."""
    reads_subscription: bool = True
    """Start-up checks the subscription (exactly-once delivery) through the subscriber."""
    keeps_order: bool = True
    """Later messages of an ordering key wait for an unfinished earlier one here (pull: the
    client hands the next one out as soon as one is settled; push: Pub/Sub waits for a 2xx)."""


PULL = Door("pull")
"""The pull worker's door."""


class Engine:
    """Delivers messages to one handler through the job protocol. Thread-safe.

    ``handler`` is ``handler(message, job)`` or an existing ``callback(message)``, sync
    or ``async def``, or one wrapped already (``@exactly_once``: its options are used
    where none are given here); anything else raises
    :class:`~pubsub_worker.errors.InvalidHandler` now. Nothing is read from the
    environment until :meth:`start` or the first delivery.
    """

    def __init__(self, handler: Any, *, door: Door = PULL, **options: Unpack[Options]) -> None:
        inner = cast("Options", getattr(handler, "options", {})) if _is_wrapped(handler) else {}
        given = {name: value for name, value in options.items() if value is not None}
        self.options: Options = {**inner, **given}  # type: ignore[typeddict-item]
        self.call = HandlerCall(handler)
        self.door = door
        self._publisher = self.options.get("publisher")
        self.arriving: Callable[[], int | None] | None = None  # messages waiting for a thread
        self._hooks = self.options.get("hooks") or Hooks()
        self._lock = threading.Lock()  # guards _runtime, _closed and _shutdown
        self._runtime: Runtime | None = None
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._closed = False  # close() ran; a start() after it begins a new run
        self._shutdown: threading.Thread | None = None
        self._reviews_checked = False  # no failed job waits for an unset failure topic

    # -- lifecycle ----------------------------------------------------------------

    def configured(self) -> Settings:
        """The settings as given or configured (the environment read once); nothing is built."""
        with self._lock:
            settings = self.options.get("settings")
            if settings is None:
                settings = self.options["settings"] = Settings.from_env()
            return settings

    def start(
        self,
        settings: Settings | None = None,
        *,
        check_subscription: bool = True,
        conclude_off_thread: bool = False,
        concluding_threads: int | None = None,
    ) -> Runtime:
        """Read settings, build clients, check what can be checked; idempotent.

        See :meth:`pubsub_worker.ExactlyOnce.start`. A start after
        :meth:`close`, :meth:`drain` or a shutdown begins a new run.
        """
        if settings is not None:
            with self._lock:
                self.options.setdefault("settings", settings)
        configured = settings or self.configured()
        with self._lock:
            if self._runtime is None:
                if self._publisher is None:
                    self._publisher = clients.publisher_client(configured)
                self._runtime = runtime.build(
                    self.door.settings_for(configured),
                    store=self.options.get("store"),
                    firestore_client=self.options.get("firestore_client"),
                    publisher=self._publisher,
                    hooks=self._hooks,
                    stopping=self._stopping,
                    draining=self._draining,
                    ordering=self.door.keeps_order,
                    arriving=self.arriving,
                )
            elif self._closed or self._draining.is_set():  # started again: a new run
                self._stopping.clear()
                self._draining.clear()
                self._shutdown = None
            self._closed = False
            rt = self._runtime
            rt.acks.resume()
            if conclude_off_thread:
                rt.completer.reopen(concluding_threads)
            if not rt.checked and (check_subscription or not self.door.reads_subscription):
                self._check(rt)
            if not self._reviews_checked:
                runtime.check_pending_reviews(rt)
                self._reviews_checked = True
            rt.keeper.start()
            return rt

    def _check(self, rt: Runtime) -> None:
        """The start-up checks: the subscription (pull), the failure topic."""
        assert self._publisher is not None
        if self.door.reads_subscription:
            subscriber = self.options.get("subscriber") or clients.subscriber_client(rt.settings)
            try:
                runtime.check_subscription(rt.settings, subscriber)
            finally:
                if self.options.get("subscriber") is None:
                    subscriber.close()
        runtime.check_failure_topic(rt.settings, self._publisher)
        rt.checked = True

    def runtime(self) -> Runtime:
        """The runtime, started if it was not."""
        rt = self._runtime
        return rt if rt is not None else self.start()

    @property
    def started(self) -> bool:
        """:meth:`start` succeeded."""
        return self._runtime is not None

    @property
    def draining(self) -> bool:
        """No new job is claimed (:meth:`drain` or a shutdown began)."""
        return self._draining.is_set()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking jobs; conclude on callback threads; wait for those handed off.

        A delivery not yet claimed is concluded without a claim (nacked: the next worker
        takes it), also one waiting for its key; acks under way are waited for, later ones
        go through the client's dispatcher. False if ``timeout_s`` passed first.
        """
        self._draining.set()
        rt = self._runtime
        if rt is None:
            return True
        rt.gate.wake()
        return rt.completer.close(timeout_s) & rt.acks.stop(timeout_s)

    def wait_concluded(self, timeout_s: float | None = None) -> bool:
        """Wait until the deliveries handed off so far are concluded."""
        return self._runtime is None or self._runtime.completer.wait(timeout_s)

    def stop_jobs(self) -> None:
        """Ask in-flight jobs to stop at their next boundary; they are released, not acked."""
        self._stopping.set()
        self.call.loop.cancel_running()

    def close(self) -> None:
        """Stop the lease keeper and the event loop, after the conclusions under way."""
        with self._lock:
            rt = self._runtime
            self._closed = True
        if rt is not None:
            rt.completer.close()
            rt.acks.stop()
            rt.keeper.stop()
        self.call.loop.stop()

    def begin_shutdown(self, grace_s: float | None = None) -> threading.Thread:
        """Drain now; after the grace, stop the jobs still in flight. Once per shutdown.

        No delivery claims a job from now on. The jobs in flight get ``grace_s``
        (``SHUTDOWN_GRACE_SECONDS`` by default) to finish; those still running
        then stop at their next boundary and are released. Returns the thread
        that waits out the grace; a second call returns the same thread (one
        grace per shutdown, whoever asks first: a signal, a server's lifespan).
        """
        with self._lock:
            if self._shutdown is not None:
                return self._shutdown
            rt = self._runtime
            if grace_s is None:
                grace_s = rt.settings.shutdown_grace_seconds if rt is not None else 0.0
            thread = threading.Thread(
                target=self._grace, args=(grace_s,), name="pubsub-worker-grace", daemon=True
            )
            self._shutdown = thread
        self._draining.set()
        if rt is not None:
            rt.gate.wake()
        thread.start()
        return thread

    def _grace(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self.watched() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.watched():
            _LOGGER.warning(
                "shutdown grace over: %d delivery(ies) in flight are stopped at their next "
                "boundary and released",
                self.watched(),
            )
            self.stop_jobs()

    def finish_shutdown(self, timeout_s: float) -> bool:
        """Wait out the grace, then up to ``timeout_s`` for the stopped jobs; close. False: late."""
        self.begin_shutdown().join()
        deadline = time.monotonic() + timeout_s
        while self.watched() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.watched()
        if left:
            _LOGGER.warning("%d delivery(ies) still in flight after the grace period", left)
        self.close()
        return not left

    # -- state --------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings deliveries run with (after :meth:`start` or the first delivery)."""
        return self.runtime().settings

    @property
    def metrics(self) -> Metrics:
        """Counters and gauges."""
        return self.runtime().metrics

    def in_flight(self) -> int:
        """Jobs claimed and not concluded."""
        return 0 if self._runtime is None else self._runtime.keeper.in_flight()

    def watched(self) -> int:
        """Deliveries in hand: waiting for their key or claim, or running."""
        return 0 if self._runtime is None else self._runtime.keeper.watched()

    def ready(self) -> tuple[bool, str]:
        """Whether new deliveries are taken now, and why not."""
        if self._runtime is None:
            return False, "starting"
        if self._draining.is_set():
            return False, "stopping: no new jobs are taken"
        return True, "ok"

    # -- one delivery -------------------------------------------------------------

    def deliver(
        self, message: Message, *, received_at: float | None = None, subscription: str | None = None
    ) -> DeliveryFlow | None:
        """Run one delivery to its outcome (a held one: until its ``ack()``/``nack()``).

        ``received_at``: ``time.monotonic()`` at receipt (the processing cap
        counts from it; default now). ``subscription``: the subscription the
        message came from, when the transport tells: it must be the one the
        jobs are recorded under. Never raises; None when the engine cannot
        start (the message was deferred).
        """
        received_at = time.monotonic() if received_at is None else received_at
        log = job_logger(_LOGGER, "?", message.message_id)
        try:
            rt = self.runtime()
        except Exception as exc:
            log.exception("the worker cannot start; the message comes back later")
            decision = Decision(Outcome.DEFER, f"cannot start: {exc}", delay_s=backoff_s(1))
            settle(decision, message, metrics=Metrics(), log=log)
            return None
        rt.hooks.received(message.message_id)
        rt.metrics.inc(Counter.RECEIVED)
        delivery = rt.tracker.register(
            message.message_id,
            message.ack_id,
            deadline=received_at + rt.settings.max_processing_seconds,
        )
        ticket = rt.keeper.watch(
            message,
            delivery,
            received_at=received_at,
            published_at=message.publish_time.timestamp(),
        )
        flow = DeliveryFlow(rt, message, delivery, ticket, log, self.call)
        try:
            wrong = _wrong_subscription(subscription, rt)
            if wrong is not None:
                log.error("refused: %s", wrong)
                flow.conclude(Happened(Phase.RECEIPT, error=ConfigError(wrong)))
            else:
                flow.run()
        except Exception as exc:
            log.exception("unexpected error")
            if not flow.detached:
                flow.conclude(Happened(Phase.RUN, error=exc))
        finally:
            flow.end()
        return flow


def _is_wrapped(handler: Any) -> bool:
    return bool(getattr(handler, "__pubsub_worker_wrapped__", False))


def _wrong_subscription(subscription: str | None, rt: Runtime) -> str | None:
    """Why a message of ``subscription`` cannot be recorded under the worker's one, if so."""
    expected = rt.subscription
    if subscription in (None, expected, rt.replay_subscription):
        return None  # its own, or its replays (recorded under its own)
    return (
        f"the message comes from {subscription}, but this worker records its jobs under "
        f"{expected} (PUBSUB_WORKER_SUBSCRIPTION): a job of one subscription would be taken "
        "for another's; set PUBSUB_WORKER_SUBSCRIPTION to the subscription it consumes"
    )
