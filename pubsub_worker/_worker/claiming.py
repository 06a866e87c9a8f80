"""A delivery's claim step: claim the job, waiting a little while another owner's lease runs.

:func:`claim_job` returns the claim when the job is this delivery's to run,
and otherwise what happened, which the delivery's flow concludes
(:meth:`~pubsub_worker._worker.flow.DeliveryFlow.conclude`): superseded,
draining, busy for too long, the store down, or a job that is done already
or whose key was used for another payload. A job found failed with its
failure message still pending has that message published here first
(:meth:`~pubsub_worker._job.failure.FailurePath.publish_pending`): the
delivery acks only once it is out.
"""

from __future__ import annotations

import time

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._job.claim import Claim, ClaimKind, ClaimRequest, claim
from pubsub_worker._support.metrics import Counter
from pubsub_worker.errors import ShuttingDown

from .outcome import Happened, Phase
from .runtime import Runtime

__all__ = ["BUSY_WAIT_S", "claim_job"]

BUSY_WAIT_S = 10.0
"""How long a delivery polls another owner's live lease before it defers."""


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
    ``BUSY_WAIT_S``: never past a lease, nor past half the processing cap (a
    push request's cap is below its lease: a claim won after the cap would only
    be released again, an attempt spent), nor once jobs are asked to stop.
    ``redelivery``: the job's document probably exists (read it first).
    """
    settings = rt.settings
    wait_s = min(BUSY_WAIT_S, settings.lease_seconds, settings.max_processing_seconds / 2)
    give_up = time.monotonic() + wait_s
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
