"""Settling a delivery on Pub/Sub: the only code in the library that acks, nacks, defers or drops.

:func:`settle` carries a final :class:`~pubsub_worker._worker.outcome.Outcome`
out on Pub/Sub once its write (if any) is durable; :func:`note_order` tells
the ordering keys whether the message is done, just before. That the ack of
a completion waits for its write is the ``durable-ack`` fence
(:mod:`pubsub_worker._support.fences`): switched off in a test,
:func:`ack_early` acks before the completion is written.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError
from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.acks import Acks, manager_of
from pubsub_worker._delivery.generations import Delivery, OrderingKeys
from pubsub_worker._delivery.lease import LOST_STATUSES
from pubsub_worker._support import fences
from pubsub_worker._support.metrics import Counter, Metrics

from .outcome import MAX_DEFER_S, MIN_DEFER_S, Decision, Outcome, Settled
from .runtime import Runtime

__all__ = [
    "AckObserver",
    "Settleable",
    "SettledAnswer",
    "ack_early",
    "may_return_unsettled",
    "note_order",
    "ordering_key",
    "settle",
    "settle_delivery",
]


class SettledAnswer:
    """How a delivery was settled, as a future made only once someone asks for it.

    Most deliveries are never asked (only a callback's ``ack_with_response()``
    and the push endpoint wait for it): they make no future. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _value and _future
        self._value: Settled | None = None
        self._future: concurrent.futures.Future[Settled] | None = None

    def set(self, value: Settled) -> None:
        """The delivery is settled; once."""
        with self._lock:
            self._value, future = value, self._future
        if future is not None:
            future.set_result(value)

    @property
    def asked(self) -> bool:
        """Someone asked for the settlement's future, and so may be waiting for it."""
        return self._future is not None

    def future(self) -> concurrent.futures.Future[Settled]:
        """Resolves with the settlement (at once if it came before)."""
        with self._lock:
            if self._future is None:
                self._future = concurrent.futures.Future()
                if self._value is not None:
                    self._future.set_result(self._value)
            return self._future


class Settleable(Protocol):
    """The part of a Pub/Sub message :func:`settle` uses."""

    @property
    def message_id(self) -> str: ...

    def ack_with_response(self) -> concurrent.futures.Future[Any]: ...

    def nack(self) -> None: ...

    def drop(self) -> None: ...

    def modify_ack_deadline(self, seconds: int) -> None: ...


AckObserver = Callable[[str], None]
"""Called with the ack's answer: ``SUCCESS``, an ``AcknowledgeStatus`` name, or ``TIMEOUT``."""

_EARLY: dict[int, concurrent.futures.Future[Any]] = {}
"""Acks sent before the completion's write (the ``durable-ack`` fence switched off), by message."""


def may_return_unsettled(message: Message, concluding_off_thread: bool) -> bool:
    """Whether a callback may return before ``message`` is settled, its ack sent later.

    Only where nobody counts on the callback's return: a worker that drains
    its conclusions before it closes the stream (``concluding_off_thread``:
    :func:`pubsub_worker.run`), or a stock client's stream that does not wait
    for its callbacks at shutdown (the client's default: a callback still
    running then sends its ack after the stream closed, continued or not).
    Never a push request's (its answer is its settlement) or a stream that
    waits for its callbacks (``await_callbacks_on_shutdown=True``).
    """
    if concluding_off_thread:
        return True
    manager = manager_of(message)
    return manager is not None and not getattr(manager, "_await_callbacks_on_shutdown", True)


def ack_early(message: Settleable) -> None:
    """Nothing, unless a test switched the ``durable-ack`` fence off: then ack now.

    Called just before a completion is written; :func:`settle` then reports
    this ack's answer instead of sending another.
    """
    if "durable-ack" in fences.OFF:
        _EARLY[id(message)] = message.ack_with_response()


def settle(
    decision: Decision,
    message: Settleable,
    *,
    metrics: Metrics,
    log: logging.LoggerAdapter[logging.Logger] | logging.Logger,
    on_ack: AckObserver | None = None,
    acks: Acks | None = None,
    awaited: bool = False,
) -> None:
    """Carry a final outcome out on Pub/Sub: the only code that acks, nacks, defers or drops.

    An ack is sent and not waited for: the job's record is durable already,
    so the callback's thread is free for the next message while the ack
    makes its round trip (the client keeps the message's flow-control slot
    until the answer). ``on_ack`` gets the answer when it comes. With
    exactly-once delivery an ``INVALID_ACK_ID`` answer loses nothing (the
    next delivery sees the record and acks); it is counted as ``acks_lost``.
    ``acks`` sends it, where it can, straight to Pub/Sub (:mod:`~pubsub_worker._delivery.acks`);
    without, the message's own ``ack_with_response()`` does. ``awaited``: someone waits for
    the ack's answer (a callback's ``ack_with_response().result()``), so ``acks`` sends it
    straight away on a fast network too.
    """
    outcome = decision.outcome
    early = _EARLY.pop(id(message), None) if _EARLY else None  # sent by ack_early
    if outcome.acks:
        _ack(message, metrics, log, on_ack, early if early is not None else acks, awaited=awaited)
    elif outcome is Outcome.DROP:
        message.drop()
    elif decision.delay_s > 0:
        # A nack would bring it back at once; a deadline of delay_s then a drop is a backoff.
        message.modify_ack_deadline(int(min(max(decision.delay_s, MIN_DEFER_S), MAX_DEFER_S)))
        message.drop()
    else:
        message.nack()


def _ack(
    message: Settleable,
    metrics: Metrics,
    log: logging.LoggerAdapter[logging.Logger] | logging.Logger,
    on_ack: AckObserver | None,
    sent: concurrent.futures.Future[Any] | Acks | None = None,
    *,
    awaited: bool = False,
) -> None:
    def answered(future: concurrent.futures.Future[Any]) -> None:
        answer = "SUCCESS"
        error = future.exception()
        if isinstance(error, AcknowledgeError):
            answer = error.error_code.name
            if error.error_code in LOST_STATUSES:
                metrics.inc(Counter.ACKS_LOST)
                metrics.inc(Counter.LOST_OWNERSHIP, phase="ack")
                log.info("ack refused (%s); the job's record is durable, nothing is lost", answer)
            else:
                metrics.inc(Counter.ACK_ERRORS)
                log.warning("ack failed (%s); a redelivery will ack", answer)
        elif error is not None:
            answer = type(error).__name__
            metrics.inc(Counter.ACK_ERRORS)
            log.warning("ack failed (%s); a redelivery will ack", error)
        if on_ack is not None:
            on_ack(answer)

    try:
        if isinstance(sent, concurrent.futures.Future):
            future = sent  # sent early (the durable-ack fence off in a test)
        else:
            future = (
                sent.send(message, awaited=awaited)
                if sent is not None
                else message.ack_with_response()
            )
    except Exception as exc:  # noqa: BLE001 - an ack error never fails a durable job
        failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
        failed.set_exception(exc)
        answered(failed)
        return
    future.add_done_callback(answered)


def ordering_key(message: Message) -> str:
    """The message's ordering key ("" without one)."""
    return getattr(message, "ordering_key", "") or ""


def note_order(
    ordering: OrderingKeys | None,
    message: Message,
    decision: Decision,
    *,
    published: float,
    arrival: int,
) -> None:
    """Whether this message of its ordering key is done, or later ones must wait for it.

    Called before the settlement, which lets the next message of its key in.
    Nothing without ``ordering`` (a push endpoint keeps no ordering memory).
    """
    key = ordering_key(message)
    if ordering is None or not key or decision.outcome is Outcome.DROP:
        return  # no key; or a newer delivery of this very message settles it
    if decision.outcome.acks:
        ordering.finished(key, message.message_id)
    else:
        ordering.unfinished(key, message.message_id, published, arrival, decision.delay_s)


def settle_delivery(
    decision: Decision,
    message: Message,
    *,
    rt: Runtime,
    delivery: Delivery,
    key: str | None,
    answer: SettledAnswer,
    log: logging.LoggerAdapter[logging.Logger],
    order: tuple[float, int],
) -> None:
    """Settle a delivery on Pub/Sub: :func:`settle`, the hooks around it, its ordering key noted.

    A delivery that a newer one of its message adopted never settles with
    its stale handle: it is dropped, and the newer one, which waits for this
    one's key, settles from the record this one left. ``answer`` is told how
    it was settled (for an ack: once answered). ``order``: the message's
    publish time and arrival, for :func:`note_order`.
    """
    if decision.outcome is not Outcome.DROP and not rt.tracker.is_current(delivery):
        why = f"{decision.why}; a newer delivery of this message settles it"
        decision = Decision(Outcome.DROP, why, phase=decision.phase)
    message_id = message.message_id
    hooks = rt.hooks
    acks = decision.outcome.acks
    outcome = decision.outcome._value_  # its value, without the enum's descriptor calls
    if acks:
        hooks.before_ack(key, message_id)

    def acked(result: str) -> None:
        hooks.settled(message_id, outcome, result)
        answer.set(Settled(decision, result))

    published, arrival = order
    note_order(rt.ordering, message, decision, published=published, arrival=arrival)
    settle(
        decision,
        message,
        metrics=rt.metrics,
        log=log,
        on_ack=acked,
        acks=rt.acks,
        awaited=answer.asked,
    )
    if not acks:
        hooks.settled(message_id, outcome, None)
        answer.set(Settled(decision))
