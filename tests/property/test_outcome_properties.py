"""``decide()``, the outcome table, as properties over everything that can happen to a delivery.

Three promises, checked on every (phase, exception, claim answer, current or
not, attempts, ``MAX_ATTEMPTS``) the flow can hand to ``decide()``: the
finite part enumerated exhaustively, the numbers drawn by hypothesis, and the
job's stored state (status, payload, owner, lease on the store's clock)
turned into the claim's answer by the claim's own ``decide()``:

* **never acks an incomplete job**: an ack follows only a final record, one
  found (completed or failed already) or one written first (the completion
  of a handler that returned, the failed record of the failure path); a
  write that failed is never followed by an ack, nor is a stale delivery's
  failure reviewed;
* **never retries a completed one**: a job found completed or failed is
  acked, a handler that returned is completed, and a failed completion is
  never counted as a failed attempt; only a claimed, current delivery runs;
* **never hot-loops**: every delay is 0 or within Pub/Sub's ack deadline
  range (10-600 s, ``MIN_DEFER_S``/``MAX_DEFER_S``, what ``settle`` sets);
  what comes back at once is bounded by something else: a retry counts an
  attempt (``MAX_ATTEMPTS`` runs, then review), a nack hands the job to its
  new owner or to another worker (the redelivery's claim then waits with a
  backoff), a release without backoff is a shutdown; a busy owner or an
  earlier message of the ordering key is not polled before its time; and a
  failed write leads to at most one other write.

The flow never hands ``decide()`` a claim phase with neither an answer nor
an error for a current delivery (``claim_job`` returns that shape only
once the delivery was superseded, and ``conclude`` marks it so), nor an
answer together with an error other than the start's (an unsent outbox
entry, ownership lost); :func:`reachable` says so, and those shapes are not
checked.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta, timezone

from hypothesis import assume, given
from hypothesis import strategies as st

from pubsub_worker._job.claim import ClaimKind, ClaimRequest
from pubsub_worker._job.claim import decide as claim_decide
from pubsub_worker._job.keys import derive_identity
from pubsub_worker._job.lease import lease_left_s
from pubsub_worker._worker.callback import CallbackNacked
from pubsub_worker._worker.outcome import (
    EFFECTS,
    MAX_DEFER_S,
    MIN_DEFER_S,
    Decision,
    Happened,
    Outcome,
    Phase,
    decide,
)
from pubsub_worker.errors import (
    ConfigError,
    DocumentTooLarge,
    FailurePathUnavailable,
    InvalidMessage,
    LimitExceeded,
    LostOwnership,
    OutboxUnsent,
    PermanentError,
    ProcessingTimeout,
    ShuttingDown,
    StoreError,
    VersionConflict,
)
from pubsub_worker.stores.base import JobRecord, Reason, Status

ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    KeyError,
    TimeoutError,
    RuntimeError,
    CallbackNacked,
    StoreError,
    VersionConflict,
    ConfigError,
    InvalidMessage,
    PermanentError,
    DocumentTooLarge,
    LimitExceeded,
    OutboxUnsent,
    FailurePathUnavailable,
    LostOwnership,
    ProcessingTimeout,
    ShuttingDown,
)
"""Every kind of exception that can end a phase: the handler's, the store's, the library's."""

WRITES = (Phase.COMPLETE, Phase.RELEASE, Phase.REVIEW)
"""The phases of a write that carries an outcome out (their failure is decided again)."""
PERMANENT_REASONS = {Reason.PERMANENT, Reason.TOO_LARGE, Reason.LIMITS}
ATTEMPT_SHAPES = ("none", "first", "below", "last", "past")
"""Where ``attempts`` stands against ``MAX_ATTEMPTS``; see :func:`attempts_at`."""


def attempts_at(shape: str, max_attempts: int) -> int:
    return {
        "none": 0,
        "first": 1,
        "below": max(max_attempts - 1, 1),
        "last": max_attempts,
        "past": max_attempts + 1,
    }[shape]


def reachable(happened: Happened) -> bool:
    """Whether the flow can hand ``decide()`` this (see the module docstring)."""
    phase, error, kind = happened.phase, happened.error, happened.claim
    if phase is not Phase.CLAIM and kind is not None:
        return False  # only the claim step reports a claim's answer
    if phase in (Phase.ORDER, Phase.GATE) and error is not None:
        return False
    if phase in WRITES and error is None:
        return False  # a write phase is decided again only when the write raised
    if phase in (Phase.RELEASE, Phase.REVIEW) and isinstance(error, OutboxUnsent):
        return False  # only the completion publishes (the failure path keeps what it cannot)
    if phase is Phase.CLAIM:
        if error is None and kind is None and happened.current:
            return False
        if error is not None and kind not in (None, ClaimKind.CLAIMED):
            return False
        if kind is ClaimKind.CLAIMED and error is not None:
            return isinstance(error, OutboxUnsent | LostOwnership)  # the claimed job's start
    return True


def attempts_for(happened: Happened, attempts: int) -> int:
    """The job's claim counter as the flow passes it: 0 before a claim, else at least 1."""
    has_job = happened.phase in (Phase.RUN, *WRITES) or happened.claim is ClaimKind.CLAIMED
    return max(attempts, 1) if has_job else 0


def check(happened: Happened, attempts: int, max_attempts: int) -> Decision:
    """``decide()``, with every promise of the module docstring asserted on its answer."""
    decision = decide(happened, attempts=attempts, max_attempts=max_attempts)
    shown = f"{happened} at {attempts}/{max_attempts} -> {decision}"
    no_hot_loop(happened, attempts, max_attempts, decision, shown)
    no_ack_of_an_incomplete_job(happened, attempts, max_attempts, decision, shown)
    no_retry_of_a_completed_job(happened, attempts, max_attempts, decision, shown)
    return decision


def no_hot_loop(
    happened: Happened, attempts: int, max_attempts: int, decision: Decision, shown: str
) -> None:
    """A delay is none at all, or one Pub/Sub keeps (10-600 s); what comes back at once is
    bounded by something else."""
    outcome, error, delay = decision.outcome, happened.error, decision.delay_s
    assert math.isfinite(delay), shown
    assert delay == 0 or MIN_DEFER_S <= delay <= MAX_DEFER_S, shown
    if outcome is Outcome.DEFER:
        assert delay >= MIN_DEFER_S, shown
    if outcome is Outcome.RELEASE and delay == 0:
        assert isinstance(error, ShuttingDown), shown  # the worker stops: another one takes it
    if outcome is Outcome.RETRY:
        # Back at once, but bounded: the release counts the attempt, and the last one reviews.
        assert happened.phase is Phase.RUN, shown
        assert attempts < max_attempts, shown
    if outcome is Outcome.NACK:
        # Back at once to whoever owns the job now (whose live lease then defers it), or to
        # another worker than this draining one.
        assert isinstance(error, LostOwnership), shown
        assert happened.current, shown
    if outcome is Outcome.DROP:
        assert not happened.current, shown  # only the current delivery can settle the message
    waited_for = happened.phase is Phase.ORDER or happened.claim is ClaimKind.BUSY
    if waited_for and outcome is Outcome.DEFER:
        # Not back before the owner's lease ends, or before the earlier message of its key.
        assert delay >= min(happened.busy_for_s, MAX_DEFER_S), shown


def no_ack_of_an_incomplete_job(
    happened: Happened, attempts: int, max_attempts: int, decision: Decision, shown: str
) -> None:
    """An ack follows a final record: one found, or one written first."""
    outcome, phase, error = decision.outcome, happened.phase, happened.error
    if outcome.acks:
        assert outcome in (Outcome.ACK, Outcome.COMPLETE, Outcome.REVIEW), shown
        assert phase not in WRITES, shown  # a write that failed recorded nothing final
    if outcome is Outcome.ACK:
        assert EFFECTS[outcome].write is None
        assert (phase, error) == (Phase.CLAIM, None), shown
        assert happened.claim in (ClaimKind.COMPLETED, ClaimKind.FAILED), shown
    if outcome is Outcome.COMPLETE:
        assert EFFECTS[outcome].write is Phase.COMPLETE  # the completion is durable, then the ack
        assert (phase, error) == (Phase.RUN, None), shown
    if outcome is not Outcome.REVIEW:
        return
    assert EFFECTS[outcome].write is Phase.REVIEW  # the failed record, then the ack
    assert happened.current, shown  # a stale delivery never publishes for review
    if phase is Phase.RECEIPT:
        assert isinstance(error, InvalidMessage), shown
        assert decision.reason == Reason.MISSING_KEY, shown
    elif phase is Phase.CLAIM:
        assert (happened.claim, decision.reason) in (
            (ClaimKind.CONFLICT, Reason.PAYLOAD_CONFLICT),
            (ClaimKind.CLAIMED, Reason.ATTEMPTS),
        ), shown
        assert decision.reason != Reason.ATTEMPTS or attempts > max_attempts, shown
    elif decision.reason in PERMANENT_REASONS:
        assert phase is Phase.RUN, shown
        assert isinstance(error, PermanentError), shown
    else:
        assert (phase, decision.reason) == (Phase.RUN, Reason.ATTEMPTS), shown
        assert attempts >= max_attempts, shown  # the last attempt failed
        assert error is not None, shown
        assert isinstance(error, ProcessingTimeout) or not isinstance(error, LostOwnership), shown


def no_retry_of_a_completed_job(
    happened: Happened, attempts: int, max_attempts: int, decision: Decision, shown: str
) -> None:
    """A job found done is acked, a handler that returned completes, and only a claimed, current
    delivery with attempts left runs."""
    outcome, phase, error = decision.outcome, happened.phase, happened.error
    if phase is Phase.CLAIM and happened.claim in (ClaimKind.COMPLETED, ClaimKind.FAILED):
        assert outcome in (Outcome.ACK, Outcome.DROP), shown
    if (phase, error) == (Phase.RUN, None):
        assert outcome is Outcome.COMPLETE, shown  # whatever the attempt, whatever the delivery
    if phase is Phase.COMPLETE:
        assert outcome not in (Outcome.RETRY, Outcome.REVIEW), shown  # not a failed attempt
    if outcome is Outcome.RUN:
        assert (phase, happened.claim, error) == (Phase.CLAIM, ClaimKind.CLAIMED, None), shown
        assert happened.current, shown
        assert 1 <= attempts <= max_attempts, shown


def happenings() -> itertools.product[tuple[Phase, type[Exception] | None, ClaimKind | None, bool]]:
    return itertools.product(Phase, (None, *ERRORS), (None, *ClaimKind), (True, False))


def test_every_finite_case_keeps_the_promises() -> None:
    """Every phase x exception x claim answer x current, at each place against MAX_ATTEMPTS."""
    seen: set[tuple[Phase, type[Exception] | None, ClaimKind | None, Outcome]] = set()
    for (phase, error, kind, current), shape, max_attempts in itertools.product(
        happenings(), ATTEMPT_SHAPES, (1, 2, 5, 100)
    ):
        happened = Happened(
            phase, error("x") if error else None, current=current, claim=kind, busy_for_s=30.0
        )
        attempts = attempts_for(happened, attempts_at(shape, max_attempts))
        if reachable(happened):
            seen.add((phase, error, kind, check(happened, attempts, max_attempts).outcome))
    # None skipped by accident: every phase, exception, answer and outcome was checked.
    assert {case[0] for case in seen} == set(Phase)
    assert {case[1] for case in seen} == {None, *ERRORS}
    assert {case[2] for case in seen} == {None, *ClaimKind}
    assert {case[3] for case in seen} == set(Outcome)


@st.composite
def what_happened(draw: st.DrawFn) -> Happened:
    """What the flow can hand ``decide()``: a phase, and what may end it there."""
    phase = draw(st.sampled_from(Phase))
    errors = st.sampled_from(ERRORS).map(lambda kind: kind("drawn"))
    kind = draw(st.none() | st.sampled_from(ClaimKind)) if phase is Phase.CLAIM else None
    if phase in (Phase.ORDER, Phase.GATE):
        error = None
    elif phase in WRITES:
        error = draw(errors)
    else:
        error = draw(st.none() | errors)
    return Happened(
        phase,
        error,
        current=draw(st.booleans()),
        claim=kind,
        busy_for_s=draw(st.floats(min_value=0.0, allow_nan=False)),
    )


@given(happened=what_happened(), attempts=st.integers(0, 10_000), max_attempts=st.integers(1, 100))
def test_the_promises_hold_for_any_attempts_setting_and_wait(
    happened: Happened, attempts: int, max_attempts: int
) -> None:
    assume(reachable(happened))
    check(happened, attempts_for(happened, attempts), max_attempts)


@given(max_attempts=st.integers(1, 100), error=st.sampled_from(ERRORS))
def test_a_job_that_keeps_failing_runs_exactly_max_attempts_times_then_goes_to_review(
    max_attempts: int, error: type[Exception]
) -> None:
    """A retry comes back at once, so what bounds the loop is the attempt it counts."""
    runs = 0
    # Each claim counts an attempt; a RETRY's release keeps the count.
    for attempts in range(1, max_attempts + 2):
        decision = check(Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED), attempts, max_attempts)
        if decision.outcome is Outcome.REVIEW:
            break
        runs += 1
        decision = check(Happened(Phase.RUN, error("again")), attempts, max_attempts)
        if decision.outcome is not Outcome.RETRY:
            break
    if issubclass(error, PermanentError):
        assert (runs, decision.outcome) == (1, Outcome.REVIEW)  # reviewed at once
    elif issubclass(error, LostOwnership) and not issubclass(error, ProcessingTimeout):
        assert runs == 1  # not the job's failure: nacked (or released) uncounted
        assert decision.outcome in (Outcome.NACK, Outcome.RELEASE)
    elif issubclass(error, OutboxUnsent):
        assert (runs, decision.outcome) == (1, Outcome.RELEASE)
        assert decision.delay_s >= MIN_DEFER_S
    else:
        assert (runs, decision.outcome, decision.reason) == (
            max_attempts,
            Outcome.REVIEW,
            Reason.ATTEMPTS,
        )


def test_a_failed_write_leads_to_at_most_one_other_write() -> None:
    """The flow writes, and decides again on the write's failure: never the same write again,
    and never a third one, so a delivery ends in a few steps."""
    second_writes = set()
    for phase, error, current, attempts in itertools.product(
        WRITES, ERRORS, (True, False), (1, 3, 5)
    ):
        failed = Happened(phase, error("x"), current=current)
        if not reachable(failed):
            continue
        then = check(failed, attempts, 5).outcome.write
        if then is None:
            continue
        second_writes.add((phase, error, then))
        assert then is not phase, failed
        for error2, current2 in itertools.product(ERRORS, (True, False)):
            failed_again = Happened(then, error2("y"), current=current2)
            if reachable(failed_again):
                assert check(failed_again, attempts, 5).outcome.write is None, failed_again
    # Only a completion whose outbox entry could not go out is followed by a write: a release
    # (fenced like every write: it lands only while this delivery's claim is the job's).
    assert second_writes == {(Phase.COMPLETE, OutboxUnsent, Phase.RELEASE)}


NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SUB = "projects/p/subscriptions/s"


@given(
    status=st.sampled_from(Status),
    same_payload=st.sampled_from([True, True, True, False]),
    stored_owner=st.sampled_from(["me", "other"]),
    abandoned=st.booleans(),
    lease_s=st.none() | st.floats(0, 600),
    age_s=st.floats(0, 1200),
    attempts=st.integers(0, 120),
    max_attempts=st.integers(1, 100),
    current=st.booleans(),
)
def test_what_the_stored_job_says_decides_the_outcome_safely(
    status: Status,
    same_payload: bool,
    stored_owner: str,
    abandoned: bool,
    lease_s: float | None,
    age_s: float,
    attempts: int,
    max_attempts: int,
    current: bool,
) -> None:
    """The job document (status, payload, owner, lease on the store's clock) through the claim's
    ``decide()`` into the outcome's: the same promises, and the claim's own."""
    identity = derive_identity(
        subscription=SUB, message_id="m1", attributes={"op": "k"}, data=b"p", key_attribute="op"
    )
    request = ClaimRequest(
        identity=identity,
        owner="me",
        message_id="m1",
        delivery="d-new",
        lease_s=60.0,
        retention_s=3600.0,
        abandoned=lambda _message, _delivery: abandoned,
    )
    record = JobRecord(
        status=status,
        epoch=3,
        owner=stored_owner,
        message_id="m1",
        delivery="d-old",
        lease_expires_at=None,
        attempts=attempts,
        payload_sha256=identity.payload_sha256 if same_payload else "another payload",
        lease_s=lease_s,
    )
    update_time = NOW
    read_time = NOW + timedelta(seconds=age_s)
    kind = claim_decide(record, request, read_time, read_time=read_time, update_time=update_time)
    left_s = lease_left_s(record, read_time, read_time=read_time, update_time=update_time)
    claimed = kind is ClaimKind.CLAIMED
    happened = Happened(
        Phase.CLAIM,
        claim=kind,
        current=current,
        busy_for_s=max(left_s, 0.0) if kind is ClaimKind.BUSY else 0.0,
    )
    decision = check(happened, attempts + 1 if claimed else 0, max_attempts)
    outcome = decision.outcome
    if not current:
        assert outcome is Outcome.DROP
    elif not same_payload:
        assert (outcome, decision.reason) == (Outcome.REVIEW, Reason.PAYLOAD_CONFLICT)
    elif status in (Status.COMPLETED, Status.FAILED):
        assert outcome is Outcome.ACK
    elif status is Status.RUNNING and left_s > 0 and not (stored_owner == "me" and abandoned):
        assert outcome is Outcome.DEFER  # another owner's live lease: back after it, not before
        assert decision.delay_s >= min(left_s, MAX_DEFER_S)
    else:
        assert outcome is (Outcome.RUN if attempts + 1 <= max_attempts else Outcome.REVIEW)
