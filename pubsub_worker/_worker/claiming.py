"""A delivery's way to its claim: the key in this process, the job in the store, its start.

Time left decides before anything is written: a delivery whose processing cap
leaves it less than :func:`min_time_left_s` is not claimed (it comes back
later, no attempt counted), and every wait on the way (the key gate, another
owner's live lease) ends that much before the cap. :func:`enter_gate` waits
for the job's key in this process: an older delivery of the same message is
waited for (its adopter settles from its record), another message of the
same key at most a lease. :func:`claim_job` returns the claim when the job is
this delivery's to run, and otherwise what happened, which the delivery's flow concludes
(:meth:`~pubsub_worker._worker.flow.DeliveryFlow.conclude`): superseded,
draining, busy for too long, the store down, or a job that is done already
or whose key was used for another payload. A job found failed with its
failure message still pending has that message published here first
(:meth:`~pubsub_worker._job.failure.FailurePath.publish_pending`): the
delivery acks only once it is out. :func:`start_job` makes the claimed job
(watched, traced, earlier owners' unsent outbox entries published) and says
whether its handler runs.
"""

from __future__ import annotations

import functools
import time

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.generations import Delivery, GateAnswer
from pubsub_worker._delivery.lease import Ticket
from pubsub_worker._job.claim import Claim, ClaimKind, ClaimRequest, claim
from pubsub_worker._job.core import JobCore
from pubsub_worker._job.keys import JobIdentity, derive_identity
from pubsub_worker._support.logs import JobLogger
from pubsub_worker._support.metrics import Counter
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker.errors import ConfigError, ProcessingTimeout, ShuttingDown

from .outcome import Decision, Happened, Outcome, Phase, decide
from .runtime import Runtime
from .settle import ordering_key

__all__ = [
    "BUSY_WAIT_S",
    "MIN_TIME_LEFT_S",
    "claim_job",
    "claim_request",
    "enter_gate",
    "identify",
    "min_time_left_s",
    "start_job",
    "wait_for_order",
]

BUSY_WAIT_S = 10.0
"""How long a delivery polls another owner's live lease before it defers."""

MIN_TIME_LEFT_S = 10.0
"""The most of its processing cap a delivery must have left to claim its job."""


@functools.lru_cache(maxsize=16)  # one cap per worker: computed once, not per delivery
def min_time_left_s(cap_s: float) -> float:
    """What a delivery needs left of its cap to claim: a quarter of the cap, 1 to 10 s.

    A claim with less would most likely be stopped at the job's first boundary
    and released with the attempt counted: a healthy job would burn its
    attempts while it waits (a push request queued past its deadline).
    """
    return min(max(cap_s / 4, 1.0), MIN_TIME_LEFT_S)


def spare_s(rt: Runtime, delivery: Delivery, now: float | None = None) -> float:
    """How long the delivery may still wait before it must claim (negative: too late)."""
    now = time.monotonic() if now is None else now
    return delivery.deadline - now - min_time_left_s(rt.settings.max_processing_seconds)


def _too_late() -> Happened:
    why = "too little of its processing cap is left to claim the job; it comes back later"
    return Happened(Phase.GATE, error=ProcessingTimeout(why))


def identify(rt: Runtime, message: Message) -> JobIdentity | Happened:
    """The job a message is for, or why it cannot be one (no exactly-once delivery, no key)."""
    settings = rt.settings
    if not message.exactly_once_enabled and not settings.allow_at_least_once:
        error = ConfigError("the subscription has no exactly-once delivery")
        return Happened(Phase.RECEIPT, error=error)
    try:
        return derive_identity(
            subscription=rt.subscription,
            message_id=message.message_id,
            attributes=message.attributes,
            data=message.data,
            key_attribute=settings.key_attribute,
        )
    except Exception as exc:  # noqa: BLE001 - InvalidMessage, or a malformed message
        return Happened(Phase.RECEIPT, error=exc)


def wait_for_order(
    rt: Runtime, message: Message, published: float, arrival: int
) -> Happened | None:
    """None, unless an earlier message of its ordering key is unfinished here (it defers)."""
    key = ordering_key(message) if rt.ordering is not None else ""
    if not key:
        return None
    assert rt.ordering is not None
    wait_s = rt.ordering.blocked_for(key, message.message_id, published, arrival)
    return None if wait_s is None else Happened(Phase.ORDER, busy_for_s=wait_s)


def enter_gate(rt: Runtime, doc_id: str, delivery: Delivery) -> Happened | None:
    """Hold the job's key in this process (None), or what happened instead.

    Never waits past the delivery's time left; another message's holder at
    most a lease. Ends early when the worker drains (not claimed, nacked) or
    when a newer delivery of this message arrives (it stands down).
    """
    spare = spare_s(rt, delivery)
    if spare <= 0:
        return _too_late()
    answer = rt.gate.acquire(doc_id, delivery, timeout_s=spare, other_s=rt.settings.lease_seconds)
    if answer is GateAnswer.HELD:
        return None
    if answer is GateAnswer.SUPERSEDED:
        return Happened(Phase.GATE, current=False)
    if answer is GateAnswer.DRAINING:
        return Happened(Phase.CLAIM, error=ShuttingDown("the worker is draining"))
    return _too_late() if spare_s(rt, delivery) <= 0 else Happened(Phase.GATE)


def claim_request(
    rt: Runtime, identity: JobIdentity, delivery: Delivery, trace_parent: str | None
) -> ClaimRequest:
    """This delivery's request to claim its job."""
    settings = rt.settings
    return ClaimRequest(
        identity=identity,
        owner=rt.owner,
        message_id=delivery.message_id,
        delivery=delivery.digest,
        lease_s=settings.lease_seconds,
        retention_s=settings.retention_days * 86400.0,
        abandoned=rt.tracker.abandoned,
        trace_parent=trace_parent,
    )


def claim_job(
    rt: Runtime,
    request: ClaimRequest,
    *,
    message: Message,
    delivery: Delivery,
    redelivery: bool,
) -> Claim | Happened:
    """The claim, when the job was claimed; otherwise what happened at the claim.

    Polls another owner's live lease (at most once a second) for up to
    ``BUSY_WAIT_S``: never past a lease, nor past the delivery's time left (a
    claim won then would only be released again, an attempt spent), nor once
    jobs are asked to stop. ``redelivery``: the job's document probably exists
    (read it first).
    """
    settings = rt.settings
    now = time.monotonic()
    spare = spare_s(rt, delivery, now)
    if spare <= 0:
        return _too_late()
    give_up = now + min(BUSY_WAIT_S, settings.lease_seconds, spare)
    try:
        while True:
            if not rt.tracker.is_current(delivery):
                return Happened(Phase.CLAIM, current=False)  # superseded: dropped
            if rt.draining.is_set():  # the worker stops: leave the message to the next one
                return Happened(Phase.CLAIM, error=ShuttingDown("the worker is draining"))
            result = claim(rt.store, request, exists_hint=redelivery)
            redelivery = True
            if result.kind is not ClaimKind.BUSY:
                break
            wait_s = result.busy_for_s
            if time.monotonic() + min(wait_s, 1.0) >= give_up or rt.context.stopping.is_set():
                rt.metrics.inc(Counter.BUSY)
                return Happened(Phase.CLAIM, claim=ClaimKind.BUSY, busy_for_s=wait_s)
            time.sleep(min(max(wait_s, 0.05), 1.0))
    except Exception as exc:  # noqa: BLE001 - StoreError or worse: the message comes back
        return Happened(Phase.CLAIM, error=exc)
    if (
        result.kind is ClaimKind.FAILED
        and result.record is not None
        and result.record.review_pending
    ):
        try:
            rt.failure.publish_pending(
                message_id=message.message_id,
                data=message.data,
                attributes=message.attributes,
                key=request.identity.key,
                doc_id=request.identity.doc_id,
                record=result.record,
                version=result.version,
            )
        except Exception as exc:  # noqa: BLE001 - the failure message first: the message comes back
            rt.metrics.inc(Counter.FAILURE_PATH_ERRORS)
            return Happened(Phase.CLAIM, error=exc)
    if result.kind is not ClaimKind.CLAIMED:
        return Happened(Phase.CLAIM, claim=result.kind)
    return result


def start_job(
    rt: Runtime,
    identity: JobIdentity,
    claimed: Claim,
    *,
    delivery: Delivery,
    ticket: Ticket,
    log: JobLogger,
    trace: DeliveryTrace,
) -> tuple[JobCore, Happened | Decision | None]:
    """The claimed job, watched and traced, earlier owners' unsent outbox entries sent.

    With it, what the delivery concludes instead of running the handler, if
    anything: an entry not sent or ownership lost (what happened), or no
    attempts left (the decision: the failure path).
    """
    assert claimed.record is not None
    assert claimed.version is not None
    job = JobCore(
        identity=identity,
        delivery=delivery,
        record=claimed.record,
        version=claimed.version,
        context=rt.context,
        log=log,
        trace=trace,
    )
    rt.keeper.attach(ticket, job, identity.key)
    record = claimed.record
    if trace.spanned:
        trace.claimed(
            key=identity.key,
            epoch=record.epoch,
            generation=delivery.generation,
            attempt=record.attempts,
            first=record.trace_parent,
        )
    try:
        job.publish_unsent()  # earlier owners' entries go out before anything else
    except Exception as exc:  # noqa: BLE001 - OutboxUnsent or LostOwnership
        return job, Happened(Phase.CLAIM, error=exc, claim=ClaimKind.CLAIMED)
    first = decide(
        Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED),
        attempts=record.attempts,
        max_attempts=rt.settings.max_attempts,
    )
    return job, (first if first.outcome is not Outcome.RUN else None)
