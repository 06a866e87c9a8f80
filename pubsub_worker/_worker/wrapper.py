"""``exactly_once``: wrap a subscriber callback so each job's effects happen once.

Order of operations for one delivery (see ``docs/architecture.md``)::

    receive ─► watch the lease ─► derive key ─► wait for the key in this process ─► claim
        ─► publish unsent outbox entries of earlier owners ─► attempts left? ─► handler
        ─► conclude: decide the outcome (pure), write what it needs, settle on Pub/Sub

This module is the pull door: a callback for the stock subscriber over the
delivery engine (:mod:`pubsub_worker._worker.engine`), which holds the
handler, the lifecycle and every delivery's intake; one delivery's path is
:class:`~pubsub_worker._worker.flow.DeliveryFlow`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.acks import manager_of
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.settings import Settings

from .engine import PULL, Engine, Options, RunOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ExactlyOnce", "Handler", "Options", "RunOptions", "exactly_once", "subscription_of"]

_MAX_RECEIPTS = 100_000

Handler = Callable[..., Any]


class ExactlyOnce:
    """A Pub/Sub callback that runs ``handler`` at most once per job epoch, to completion once.

    Pass it wherever a ``callback(message)`` goes (``subscriber.subscribe``)
    or to :func:`pubsub_worker.run`, or serve it to a push subscription
    (``pubsub-worker push``, :func:`pubsub_worker.push.create_app`): the same
    handler runs behind both doors. ``handler`` is either
    ``handler(message, job)`` (steps through ``job``; returning means done) or
    an existing ``handler(message)`` that calls ``message.ack()`` /
    ``message.nack()``, which are intercepted: ack records the completion
    and then acks, nack releases the job for a retry. Either may be an
    ``async def``: it then runs on the worker's event loop with an
    :class:`~pubsub_worker._job.async_job.AsyncJob` (``await job.step(...)``).
    Anything else raises :class:`~pubsub_worker.errors.InvalidHandler` here.

    The jobs of a message are recorded under the subscription it came from,
    which must be ``PUBSUB_WORKER_SUBSCRIPTION``: a message of another
    subscription is refused (logged as an error, left for later), never
    recorded under the wrong one.

    Nothing is read from the environment until :meth:`start` or the first
    message; call :meth:`start` yourself to fail fast on bad settings.
    """

    __pubsub_worker_wrapped__ = True

    def __init__(self, handler: Callable[..., Any], **options: Unpack[Options]) -> None:
        self._engine = Engine(handler, door=PULL, **options)
        self._receipts: dict[str, float] = {}  # ack id -> monotonic receipt time
        self._reported = False  # received() was called: receipts are reported (run())
        self._engine.arriving = self._arriving
        self.__wrapped__ = self._engine.call.handler
        self.__name__ = getattr(self.__wrapped__, "__name__", type(self).__name__)
        self.__doc__ = getattr(self.__wrapped__, "__doc__", None)

    @property
    def handler(self) -> Callable[..., Any]:
        """The handler this wraps."""
        return self._engine.call.handler  # type: ignore[no-any-return]

    @property
    def options(self) -> Options:
        """The options given (a push endpoint serving this handler uses them too)."""
        return dict(self._engine.options)  # type: ignore[return-value]

    @property
    def engine(self) -> Engine:
        """The delivery engine behind this callback."""
        return self._engine

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
        ack after the client's dispatcher stopped. Without it, a callback of
        a subscriber that waits for its callbacks at shutdown
        (``await_callbacks_on_shutdown=True``) returns once its message is
        settled, as with the stock client; at the client's default, on a
        store that continues writes, once its completion is handed over.
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
        self._engine.start(
            settings,
            check_subscription=check_subscription,
            conclude_off_thread=conclude_off_thread,
            concluding_threads=concluding_threads,
        )

    def close(self) -> None:
        """Stop the lease keeper and the event loop. In-flight callbacks should have ended.

        The conclusions under way (completion writes, then acks) are waited for first.
        """
        self._engine.close()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking jobs; conclude on callback threads; wait for those handed off.

        From now on a delivery that has not claimed its job is nacked without
        a claim (the next worker takes it, nothing is written), also one
        waiting for its key, and every later conclusion happens on its own
        callback thread. Waits for the conclusions handed to the completer and
        for the messages an existing callback handed to its own threads (until
        their ``ack()``/``nack()``). Call this before cancelling the
        subscriber's streaming-pull future, so that every ack is sent before
        the stream closes; :func:`pubsub_worker.run` does. False if
        ``timeout_s`` passed with conclusions still under way. A later
        :meth:`start` takes jobs again.
        """
        return self._engine.drain(timeout_s)

    def wait_concluded(self, timeout_s: float | None = None) -> bool:
        """Wait until the deliveries handed off so far are concluded (acked, nacked...)."""
        return self._engine.wait_concluded(timeout_s)

    def stop_jobs(self) -> None:
        """Ask in-flight jobs to stop at their next boundary; they are released, not acked.

        An ``async def`` handler's task is cancelled too: awaiting a long call,
        it may be nowhere near a boundary. Its job is released, the attempt
        given back, as for any stop.
        """
        self._engine.stop_jobs()

    @property
    def settings(self) -> Settings:
        """The settings in use (after :meth:`start` or the first message)."""
        return self._engine.settings

    @property
    def metrics(self) -> Metrics:
        """Counters and gauges of this worker."""
        return self._engine.metrics

    def in_flight(self) -> int:
        """Jobs being processed right now."""
        return self._engine.in_flight()

    def received(self, message: Message) -> None:
        """Note that ``message`` was received: its processing time counts from now.

        :func:`pubsub_worker.run` calls it from its scheduler, before the
        message waits for a thread. Without it the time counts from the call.
        """
        self._reported = True
        if len(self._receipts) < _MAX_RECEIPTS:
            self._receipts[message.ack_id] = time.monotonic()

    def _arriving(self) -> int | None:
        """Messages :meth:`received` and not yet handed over (waiting for a thread); None
        when receipts are not reported (a plain ``subscribe``: the wrapper cannot tell)."""
        return len(self._receipts) if self._reported else None

    # -- one delivery -------------------------------------------------------------

    def __call__(self, message: Message) -> None:
        """Handle one delivery; never raises (errors are logged, the message kept or deferred)."""
        received_at = self._receipts.pop(message.ack_id, None)
        self._engine.deliver(
            message, received_at=received_at, subscription=subscription_of(message)
        )


def subscription_of(message: Message) -> str | None:
    """The subscription a stock client's message came from, or None when it cannot tell.

    Its streaming pull manager (:func:`~pubsub_worker._delivery.acks.manager_of`)
    knows the subscription the ``subscribe`` call was given.
    """
    subscription = getattr(manager_of(message), "_subscription", None)
    return subscription if isinstance(subscription, str) else None


@overload
def exactly_once(handler: Callable[..., Any], **options: Unpack[Options]) -> ExactlyOnce: ...


@overload
def exactly_once(
    handler: None = None, **options: Unpack[Options]
) -> Callable[[Callable[..., Any]], ExactlyOnce]: ...


def exactly_once(
    handler: Callable[..., Any] | None = None, **options: Unpack[Options]
) -> ExactlyOnce | Callable[[Callable[..., Any]], ExactlyOnce]:
    """Wrap a callback for exactly-once processing; usable bare or with arguments.

    ``@exactly_once`` or ``@exactly_once(settings=..., firestore_client=...)``.
    Returns an :class:`ExactlyOnce`, which takes ``(message)`` like any
    Pub/Sub callback; with arguments and no handler, the decorator that makes one
    (typed both ways, so an editor knows what the decorated name is).
    """

    def wrap(fn: Callable[..., Any]) -> ExactlyOnce:
        return ExactlyOnce(fn, **options)

    return wrap(handler) if handler is not None else wrap
