"""What a concluded delivery reports: its counter and log line, its span's end, its duration.

Reporting changes nothing about the outcome; it runs once per delivery, from
:meth:`~pubsub_worker._worker.flow.DeliveryFlow.carry_out`.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING

from pubsub_worker._job.core import JobCore
from pubsub_worker._support.logs import JobLogger
from pubsub_worker._support.metrics import Counter, Histogram, Metrics
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker.errors import LostOwnership, ShuttingDown

from .outcome import Decision, Outcome, Phase

__all__ = ["count", "ended"]

_COUNTS: dict[Outcome, tuple[Counter, int, str]] = {
    Outcome.COMPLETE: (Counter.COMPLETED, INFO, "completed (attempt %(attempt)d, epoch %(epoch)d)"),
    Outcome.ACK: (Counter.ALREADY_DONE, INFO, "%(why)s; acked without running"),
    Outcome.RETRY: (Counter.RETRIED, WARNING, "%(why)s"),
    Outcome.NACK: (Counter.LOST_OWNERSHIP, INFO, "%(why)s; nacked for redelivery without ack"),
    Outcome.DROP: (Counter.LOST_OWNERSHIP, INFO, "%(why)s; stale, dropped without ack"),
    Outcome.DEFER: (Counter.DEFERRED, WARNING, "%(why)s; the message comes back in %(delay).0f s"),
    Outcome.RELEASE: (Counter.RETRIED, INFO, "%(why)s; released for another delivery"),
}
"""Each outcome's counter, log level and message (``RUN`` is not final; ``REVIEW`` is counted
and logged by the failure path). ``LOST_OWNERSHIP`` is labelled with where it was lost."""


def count(
    decision: Decision,
    *,
    metrics: Metrics,
    log: JobLogger,
    job: JobCore | None,
    renewal_lost: bool,
    error: BaseException | None = None,
) -> None:
    """Count the outcome and log it (``renewal_lost``: the delivery's lease renewal failed).

    An exception the handler raised (``error``, not one of the job's stop
    signals) is logged with its traceback: on the outcome's line, or on a
    line of its own when it sends the job to review.
    """
    raised = _raised(decision, error)
    if raised is not None and decision.outcome is Outcome.REVIEW:
        log.error("the handler raised: %s", decision.why, exc_info=raised)
    if decision.error_type == ShuttingDown.__name__ and decision.phase is Phase.CLAIM:
        log.info("%s", decision.why)  # draining, not claimed: nothing was lost
        return
    found = _COUNTS.get(decision.outcome)
    if found is None:
        return
    counter, level, text = found
    if counter is Counter.LOST_OWNERSHIP:
        metrics.inc(counter, phase=_lost_phase(decision, renewal_lost))
    else:
        metrics.inc(counter)
    if not log.logger.isEnabledFor(level):  # the adapter's own would add a call
        return  # no record: nothing to fill in
    fields: dict[str, object] = {"why": decision.why, "delay": decision.delay_s}
    if decision.outcome is Outcome.COMPLETE:
        assert job is not None
        fields.update(attempt=job.attempt, epoch=job.epoch)
    log.log(level, text, fields, exc_info=raised)


def _raised(decision: Decision, error: BaseException | None) -> BaseException | None:
    """The handler's own exception, with a traceback to show; None for a stop signal."""
    if error is None or decision.phase is not Phase.RUN or error.__traceback__ is None:
        return None
    return None if isinstance(error, LostOwnership) else error


def _lost_phase(decision: Decision, renewal_lost: bool) -> str:
    """Where ownership was lost: receipt, renewal, step_commit (acks: in ``settle``)."""
    if renewal_lost:
        return "renewal"
    if decision.phase in (Phase.RECEIPT, Phase.GATE, Phase.CLAIM):
        return "receipt"
    return "step_commit"


def ended(
    decision: Decision,
    *,
    trace: DeliveryTrace,
    metrics: Metrics,
    subscription: str,
    started: float,
) -> None:
    """End the delivery's span and observe its duration (since ``started``, monotonic seconds)."""
    outcome = decision.outcome
    error_type = None if outcome.fine else decision.error_type
    if trace.spanned:
        trace.ended(outcome.value, error_type or outcome.lost_error_type)
    elapsed = time.monotonic() - started
    if not metrics.exporting:  # the attributes are for OpenTelemetry alone
        metrics.observe(Histogram.PROCESS_DURATION, elapsed)
        return
    metrics.observe(
        Histogram.PROCESS_DURATION,
        elapsed,
        **{
            "messaging.system": "gcp_pubsub",
            "messaging.destination.subscription.name": subscription,
            "pubsub_worker.outcome": outcome.value,
            **({"error.type": error_type} if error_type else {}),
        },
    )
