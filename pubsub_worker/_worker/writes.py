"""The write each outcome needs, made before its message is settled.

A completion writes the job ``completed`` (its unsent outbox entries
published first), a release or a retry gives it back for another delivery, and
a review sends it to the failure path (:class:`~pubsub_worker._job.failure.FailurePath`).
Each write is fenced on the owner's version: one that fails raises, and the
delivery's flow decides again from that failure
(:meth:`~pubsub_worker._worker.flow.DeliveryFlow.carry_out`). Outcomes
without a write (ack, nack, defer, drop) write nothing.
"""

from __future__ import annotations

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._job.core import JobCore
from pubsub_worker.errors import LostOwnership

from .outcome import Decision, Outcome
from .runtime import Runtime
from .settle import ack_early

__all__ = ["write_for"]


def write_for(
    decision: Decision,
    *,
    rt: Runtime,
    message: Message,
    key: str | None,
    job: JobCore | None,
) -> None:
    """Make the write ``decision`` needs (none for some outcomes); raises if it fails."""
    outcome = decision.outcome
    if outcome.write is None:
        return
    if outcome is Outcome.REVIEW:
        rt.failure.send(
            message_id=message.message_id,
            data=message.data,
            attributes=message.attributes,
            key=key,
            reason=decision.reason or "error",
            error=decision.error or decision.why,
            job=job,
        )
        return
    if job is None:
        raise LostOwnership("no job was claimed")  # cannot happen: decide needs a claim
    if outcome is Outcome.COMPLETE:
        ack_early(message)  # the durable-ack fence: nothing unless a test switched it off
        job.complete()
    else:
        job.release(decision.error, count_attempt=outcome is Outcome.RETRY)
