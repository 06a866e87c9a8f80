"""The outcome of a delivery: decided by one pure function, carried out by one other.

What happens to a message is an :class:`Outcome`. :func:`decide` maps what
happened (the phase a delivery reached, and the exception that ended it, if
any) plus the job's record and the settings to a :class:`Decision`; it does
no I/O. Each outcome says what carrying it out takes (:data:`EFFECTS`: does
it ack, which write, does it count as success); the delivery's flow
(:meth:`~pubsub_worker._worker.flow.DeliveryFlow.carry_out`) makes the write
(complete, release, review) and, if that write itself fails, decides again
from the new event; :func:`~pubsub_worker._worker.settle.settle` is then the
only code in the library that acks, nacks, defers or drops a Pub/Sub message.

::

    phase      what happened                         outcome
    receipt    worker cannot start / no EOD          DEFER (backoff)
               key attribute missing                 REVIEW
    order      an earlier message of its ordering    DEFER (until that one is back)
               key deferred or released here
    gate       key busy in this process too long     DEFER
               too little of the cap left to claim   DEFER (nothing written)
    claim      worker draining (not claimed)         NACK
               completed / failed already            ACK (a failed job's pending
                                                     failure message published first)
               payload conflict                      REVIEW
               another owner's live lease            DEFER (until it ends)
               store unavailable                     DEFER (backoff)
               claimed, attempts left                RUN
               claimed, MAX_ATTEMPTS reached         REVIEW
    run        lost (Pub/Sub refused it, given up)   DROP
               returned                              COMPLETE
               PermanentError (too large, limits)    REVIEW
               ShuttingDown                          RELEASE
               LostOwnership                         NACK if current else DROP
               ProcessingTimeout, error, StoreError  RETRY, or REVIEW at MAX_ATTEMPTS
    complete   outbox entry not sent                 RELEASE (backoff)
    any write  LostOwnership                         NACK if current else DROP
               anything else                         DEFER (backoff)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum

from pubsub_worker._job.claim import ClaimKind
from pubsub_worker._support.values import quick_init
from pubsub_worker.errors import (
    DocumentTooLarge,
    InvalidMessage,
    LimitExceeded,
    LostOwnership,
    OutboxUnsent,
    PermanentError,
    ProcessingTimeout,
    ShuttingDown,
)
from pubsub_worker.stores.base import Reason

__all__ = [
    "EFFECTS",
    "Decision",
    "Effect",
    "Happened",
    "Outcome",
    "Phase",
    "Settled",
    "backoff_s",
    "decide",
    "decided",
]

MIN_DEFER_S = 10
MAX_DEFER_S = 600
"""Pub/Sub's ack deadline range: a deferred message comes back within these bounds."""


class Outcome(str, Enum):
    """What happens to one delivery; what carrying it out takes is in :data:`EFFECTS`.

    ``RUN`` follows the claim's write (the handler runs next); ``COMPLETE``,
    ``RETRY``, ``RELEASE`` and ``REVIEW`` make one write of the job each
    (:attr:`write`) before settling; ``ACK``, ``NACK``, ``DEFER`` and ``DROP``
    write nothing and only settle on Pub/Sub.
    """

    RUN = "run"
    """The delivery owns the job at a new epoch: run the handler (not final)."""
    COMPLETE = "complete"
    """The handler returned: publish unsent outbox entries, commit the completion, then ack."""
    RETRY = "retry"
    """The attempt failed: release the job, counting the attempt, and nack for a redelivery."""
    RELEASE = "release"
    """Not the job's fault (shutdown, an outbox entry not sent yet): release without counting
    the attempt; nack (after ``delay_s``)."""
    REVIEW = "review"
    """The reviewed failure path: record ``failed`` (fenced), publish for review, then ack."""
    ACK = "ack"
    """The job's record is final already (completed, or failed and reviewed): ack only."""
    NACK = "nack"
    """Nothing to write and this delivery is still current: nack so the redelivery comes now."""
    DEFER = "defer"
    """Nothing can be written now: leave the message unacked and let it come back after
    ``delay_s`` (its ack deadline is set to the delay, then it is dropped from lease
    management): a backoff, never a hot loop."""
    DROP = "drop"
    """This delivery is stale (a newer one exists, or Pub/Sub refused its ack id): stop
    leasing it and never ack; the current delivery owns the message."""

    # What carrying it out takes, from :data:`EFFECTS` (set on each member once, below: read on
    # every delivery, a property would cost a call each time).
    acks: bool
    """Settled by an ack (the job's record is final); otherwise nacked, deferred or dropped."""
    write: Phase | None
    """The phase of the write that carries it out (its failure is decided again); or None."""
    fine: bool
    """A success for metrics and traces (no ``error.type``)."""
    lost_error_type: str | None
    """The error type a trace names when the decision carries none (ownership was lost)."""


class Phase(str, Enum):
    """How far a delivery got."""

    RECEIPT = "receipt"
    ORDER = "order"
    GATE = "gate"
    CLAIM = "claim"
    RUN = "run"
    COMPLETE = "complete"
    RELEASE = "release"
    REVIEW = "review"


@dataclass(frozen=True)
class Effect:
    """What carrying out an :class:`Outcome` takes."""

    acks: bool
    write: Phase | None
    fine: bool
    lost_error_type: str | None = None


_LOST = LostOwnership.__name__

# fmt: off
EFFECTS: dict[Outcome, Effect] = {
    #                         acks   write           fine   lost as
    Outcome.RUN:      Effect(False, None,           True),         # the claim was the write
    Outcome.COMPLETE: Effect(True,  Phase.COMPLETE, True),
    Outcome.RETRY:    Effect(False, Phase.RELEASE,  False),        # counts the attempt
    Outcome.RELEASE:  Effect(False, Phase.RELEASE,  False),
    Outcome.REVIEW:   Effect(True,  Phase.REVIEW,   False),
    Outcome.ACK:      Effect(True,  None,           True),
    Outcome.NACK:     Effect(False, None,           False, _LOST),
    Outcome.DEFER:    Effect(False, None,           False),
    Outcome.DROP:     Effect(False, None,           False, _LOST),
}
"""Each outcome's ack, write and success, at a glance (the attributes of :class:`Outcome`)."""
# fmt: on

for _outcome, _effect in EFFECTS.items():
    _outcome.acks, _outcome.write = _effect.acks, _effect.write
    _outcome.fine, _outcome.lost_error_type = _effect.fine, _effect.lost_error_type
del _outcome, _effect


@quick_init
@dataclass(frozen=True)
class Happened:
    """What happened to a delivery: the phase it reached and how that phase ended."""

    phase: Phase
    error: BaseException | None = None
    """What ended the phase; ``None`` when it succeeded."""
    current: bool = True
    """This delivery is still the latest of its message and Pub/Sub has not refused it."""
    claim: ClaimKind | None = None
    """The answer to the claim (phase ``claim``)."""
    busy_for_s: float = 0.0
    """How much longer another owner's lease runs (claim answered ``busy``), or how long until
    the earlier message of its ordering key is back (phase ``order``)."""

    def seen(self, *, current: bool, error: BaseException | None) -> Happened:
        """This event as the flow concludes it: ``current`` checked, ``error`` the stop's if any.

        Itself when both are as they were (most deliveries); else built directly rather than
        with ``dataclasses.replace``: it runs for every delivery.
        """
        if current is self.current and error is self.error:
            return self
        return Happened(self.phase, error, current, self.claim, self.busy_for_s)


@quick_init
@dataclass(frozen=True)
class Decision:
    """An outcome and what it needs: why, the error to record, how long to wait."""

    outcome: Outcome
    why: str
    reason: str | None = None
    """Failure-path reason (``REVIEW`` only)."""
    error: str | None = None
    """Error text to record on a release or failure."""
    delay_s: float = 0.0
    """``NACK``/``RETRY``/``RELEASE``/``DEFER``: seconds until the message comes back."""
    phase: Phase | None = None
    """The phase the delivery reached (for metrics and logs)."""
    error_type: str | None = None
    """What ended the delivery, low cardinality (an exception class name), if not success."""


@quick_init
@dataclass(frozen=True)
class Settled:
    """How a delivery was settled on Pub/Sub: its decision and, for an ack, the answer."""

    decision: Decision
    answer: str | None = None
    """``SUCCESS``, an ``AcknowledgeStatus`` name or an error's type; None without an ack."""


def backoff_s(tries: int) -> float:
    """Delay before a deferred message comes back: 10 s doubling per try, at most 600 s."""
    return float(min(MAX_DEFER_S, MIN_DEFER_S * 2 ** max(min(tries, 10) - 1, 0)))


def describe(exc: BaseException, limit: int = 4000) -> str:
    """``Type: message``, clipped, for records and logs."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "…"


def decide(happened: Happened, *, attempts: int, max_attempts: int) -> Decision:
    """The outcome of a delivery. Pure: no I/O, no clock.

    ``attempts`` is the job's own claim counter (0 before a claim),
    ``max_attempts`` the ``MAX_ATTEMPTS`` setting. The two decisions of most
    deliveries (claimed with attempts left, then the handler returned) are
    built once, not per delivery: :func:`decided` is the whole table.
    """
    if happened.error is None and happened.current:
        phase = happened.phase
        if phase is Phase.RUN:
            return _COMPLETED
        claimed = phase is Phase.CLAIM and happened.claim is ClaimKind.CLAIMED
        if claimed and attempts <= max_attempts:
            return _claimed(attempts)
    return decided(happened, attempts=attempts, max_attempts=max_attempts)


def decided(happened: Happened, *, attempts: int, max_attempts: int) -> Decision:
    """:func:`decide`, every decision built from the table (what its shortcuts must equal)."""
    d = _decide(happened, attempts, max_attempts)
    error = happened.error
    # Built directly, not with dataclasses.replace: it runs for every delivery off the common path.
    return Decision(
        outcome=d.outcome,
        why=d.why,
        reason=d.reason,
        error=d.error,
        delay_s=d.delay_s,
        phase=happened.phase,
        error_type=type(error).__name__ if error is not None else None,
    )


_COMPLETED = Decision(Outcome.COMPLETE, "the handler returned", phase=Phase.RUN)
"""A handler that returned, still current: the decision of most deliveries."""


@functools.lru_cache(maxsize=64)
def _claimed(attempts: int) -> Decision:
    """Claimed with attempts left: run the handler (one decision per attempt number)."""
    return Decision(Outcome.RUN, f"claimed (attempt {attempts})", phase=Phase.CLAIM)


def _decide(happened: Happened, attempts: int, max_attempts: int) -> Decision:
    phase, error = happened.phase, happened.error
    lost = Outcome.NACK if happened.current else Outcome.DROP
    tries = max(attempts, 1)
    if not happened.current and phase in (Phase.RECEIPT, Phase.ORDER, Phase.GATE, Phase.CLAIM):
        return Decision(Outcome.DROP, "a newer delivery of this message exists")
    if phase is Phase.RECEIPT:
        if isinstance(error, InvalidMessage):
            return Decision(Outcome.REVIEW, str(error), Reason.MISSING_KEY, str(error))
        why = "the worker cannot process messages" if error is None else describe(error)
        return Decision(Outcome.DEFER, why, delay_s=backoff_s(tries))
    if phase is Phase.ORDER:
        # Back after the earlier message of its key is, so Pub/Sub hands them out in order.
        delay = min(max(happened.busy_for_s + 1.0, MIN_DEFER_S), MAX_DEFER_S)
        why = "an earlier message of its ordering key is not done yet"
        return Decision(Outcome.DEFER, why, delay_s=delay)
    if phase is Phase.GATE:
        if isinstance(error, ProcessingTimeout):  # not claimed: no attempt counted
            return Decision(Outcome.DEFER, str(error), delay_s=MIN_DEFER_S)
        return Decision(Outcome.DEFER, "the key stayed busy in this process", delay_s=MIN_DEFER_S)
    if phase is Phase.CLAIM:
        return _after_claim(happened, attempts, max_attempts, lost)
    if phase is Phase.RUN:
        if error is not None and not happened.current:
            # A newer delivery owns the message: writing a release or publishing for review
            # from here would race it (and duplicate its failure message).
            if isinstance(error, LostOwnership) and not isinstance(
                error, ProcessingTimeout | ShuttingDown
            ):
                return Decision(Outcome.DROP, f"ownership lost ({error})")
            return Decision(Outcome.DROP, f"superseded while running ({describe(error)})")
        return _after_run(error, attempts, max_attempts, lost)
    # A write that carries out an outcome failed.
    if isinstance(error, LostOwnership):
        return Decision(lost, f"ownership lost while writing ({error})")
    if isinstance(error, OutboxUnsent):
        text = describe(error)
        return Decision(Outcome.RELEASE, text, error=text, delay_s=backoff_s(tries))
    why = describe(error) if error is not None else f"{phase.value} failed"
    return Decision(Outcome.DEFER, why, delay_s=backoff_s(tries))


def _after_claim(happened: Happened, attempts: int, max_attempts: int, lost: Outcome) -> Decision:
    error, kind = happened.error, happened.claim
    if isinstance(error, ShuttingDown):
        return Decision(Outcome.NACK, "the worker is draining: not claimed, nacked")
    if isinstance(error, LostOwnership):
        return Decision(lost, f"superseded before the claim ({error})")
    if isinstance(error, OutboxUnsent):
        text = describe(error)
        return Decision(Outcome.RELEASE, text, error=text, delay_s=backoff_s(attempts))
    if error is not None:
        return Decision(Outcome.DEFER, describe(error), delay_s=backoff_s(attempts))
    if kind is ClaimKind.COMPLETED or kind is ClaimKind.FAILED:
        return Decision(Outcome.ACK, f"job already {kind.value}")
    if kind is ClaimKind.CONFLICT:
        text = "the key was already used for a message with a different payload"
        return Decision(Outcome.REVIEW, text, Reason.PAYLOAD_CONFLICT, text)
    if kind is ClaimKind.BUSY:
        delay = min(max(happened.busy_for_s, MIN_DEFER_S), MAX_DEFER_S)
        return Decision(Outcome.DEFER, "another owner holds a live lease", delay_s=delay)
    if attempts > max_attempts:
        text = f"gave up after {max_attempts} attempts"
        return Decision(Outcome.REVIEW, text, Reason.ATTEMPTS, text)
    return Decision(Outcome.RUN, f"claimed (attempt {attempts})")


def _after_run(
    error: BaseException | None, attempts: int, max_attempts: int, lost: Outcome
) -> Decision:
    if error is None:
        return Decision(Outcome.COMPLETE, "the handler returned")
    text = describe(error)
    if isinstance(error, ShuttingDown):
        return Decision(Outcome.RELEASE, "the worker is shutting down")
    if isinstance(error, LostOwnership) and not isinstance(error, ProcessingTimeout):
        return Decision(lost, f"ownership lost ({error})")
    if isinstance(error, PermanentError):
        reason = Reason.PERMANENT
        if isinstance(error, DocumentTooLarge):
            reason = Reason.TOO_LARGE
        elif isinstance(error, LimitExceeded):
            reason = Reason.LIMITS
        return Decision(Outcome.REVIEW, text, reason, text)
    if isinstance(error, OutboxUnsent):
        return Decision(Outcome.RELEASE, text, error=text, delay_s=backoff_s(attempts))
    if attempts >= max_attempts:
        return Decision(Outcome.REVIEW, f"attempt {attempts} failed: {text}", Reason.ATTEMPTS, text)
    return Decision(Outcome.RETRY, f"attempt {attempts} failed, will retry: {text}", error=text)
