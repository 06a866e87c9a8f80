"""A one-step delivery through the library's own parts, in one object (``inprocess --floor``).

:class:`LeanDelivery` sits between the floor (:mod:`benchmarks.floor`: the
work alone) and the library: it runs a one-step delivery through the same
parts the library's delivery uses, taken from a started worker's runtime
(the delivery tracker, the key gate, the lease keeper, the claim, the
outcome table, the logger, the trace, the metrics, the hooks and the ack's
settlement), called in order from one method on one object that is also
the job the lease keeper watches. What it leaves out is the structure the
library builds around those parts per delivery (the flow, the job and its
faces, the fenced document, the outbox, the budget, the settled answer) and
every path but the one taken (a busy, lost or superseded job, a failed
write, the failure path, a held message): a prototype of "one object per
delivery", timed beside the library and the floor so that what such a
redesign could save reads before it is built (``docs/benchmarks-history.md``, tenth pass).
It is not a worker. ``tests/unit/test_bench_floor.py`` checks that it
writes what the library writes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from pubsub_worker._job import endings
from pubsub_worker._job.claim import ClaimKind, claim
from pubsub_worker._job.lease import now_utc
from pubsub_worker._job.records import encode
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Counter
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker._worker import report
from pubsub_worker._worker.claiming import claim_request, enter_gate, identify
from pubsub_worker._worker.outcome import Happened, Outcome, Phase, decide
from pubsub_worker._worker.runtime import Runtime
from pubsub_worker._worker.settle import SettledAnswer, settle_delivery
from pubsub_worker._worker.wrapper import ExactlyOnce
from pubsub_worker.stores import base as s

__all__ = ["LeanDelivery", "runtime_of"]

_LOGGER = logging.getLogger("pubsub_worker.lean")


def runtime_of(wrapped: ExactlyOnce) -> Runtime:
    """The runtime of a started wrapper: the parts its deliveries use."""
    return wrapped._engine.runtime()


class LeanDelivery:
    """Runs one-step deliveries through ``rt``'s parts (see the module's doc); the step's
    result is ``1``, recorded as JSON under ``step_name``."""

    def __init__(self, rt: Runtime, *, step_name: str = "one") -> None:
        self._rt = rt
        self._step_name = step_name
        self.completed = 0

    def __call__(self, message: Any) -> None:
        _Lean(self._rt, message, self._step_name).run()
        self.completed += 1


class _Lean:
    """One delivery, and the job the lease keeper watches while it runs."""

    def __init__(self, rt: Runtime, message: Any, step_name: str) -> None:
        self.rt = rt
        self.message = message
        self.step_name = step_name
        self.last_progress = time.monotonic()
        self.abandoned = False
        self.held = False
        self.settling = False
        self.attempt = 0
        self.epoch = 0

    # -- what the lease keeper reads ---------------------------------------------------

    @property
    def unsent_count(self) -> int:
        return 0

    @property
    def store_lease_due(self) -> bool:
        return False

    def keep_alive(self) -> None:
        self.last_progress = time.monotonic()

    # -- the delivery -----------------------------------------------------------------

    def run(self) -> None:
        rt, message = self.rt, self.message
        received_at = self.last_progress
        published = message.publish_time.timestamp()
        log = job_logger(_LOGGER, "?", message.message_id)
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
            published_at=published,
        )
        trace = DeliveryTrace(message, rt.subscription)
        identity = identify(rt, message)
        if isinstance(identity, Happened):
            raise RuntimeError(f"not a job: {identity}")
        log.name_job(identity.key)
        held = False
        try:
            if enter_gate(rt, identity.doc_id, delivery) is not None:
                raise RuntimeError("the key is held")
            held = True
            request = claim_request(rt, identity, delivery, trace.trace_parent())
            got = claim(rt.store, request)
            if got.kind is not ClaimKind.CLAIMED or got.record is None or got.version is None:
                raise RuntimeError(f"not claimed: {got.kind}")
            record = got.record
            self.attempt, self.epoch = record.attempts, record.epoch
            rt.keeper.attach(ticket, self, identity.key)
            if trace.spanned:  # as the library's start_job
                trace.claimed(
                    key=identity.key,
                    epoch=record.epoch,
                    generation=delivery.generation,
                    attempt=record.attempts,
                    first=record.trace_parent,
                )
            first = decide(
                Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED),
                attempts=record.attempts,
                max_attempts=rt.settings.max_attempts,
            )
            if first.outcome is not Outcome.RUN:
                raise RuntimeError(f"not run: {first}")
            result = encode(self.step_name, 1)  # the step: ``lambda: 1``
            if not rt.tracker.owns(delivery):
                raise RuntimeError("the delivery lost its job")
            self.settling = True
            decision = decide(
                Happened(Phase.RUN),
                attempts=record.attempts,
                max_attempts=rt.settings.max_attempts,
            )
            now = now_utc()
            changes = {
                (s.STEPS, self.step_name): {"result": result, "epoch": record.epoch, "at": now},
                (s.UPDATED_AT,): now,
                **endings.completed(now, rt.settings.retention_days * 86400.0),
            }
            rt.store.update(identity.doc_id, changes, expected=got.version)
            report.count(
                decision,
                metrics=rt.metrics,
                log=log,
                job=cast(Any, self),
                renewal_lost=False,
                error=None,
            )
            settle_delivery(
                decision,
                message,
                rt=rt,
                delivery=delivery,
                key=identity.key,
                answer=SettledAnswer(),
                log=log,
                order=(published, 0),
            )
            report.ended(
                decision,
                trace=trace,
                metrics=rt.metrics,
                subscription=rt.subscription,
                started=received_at,
            )
        finally:
            if held:
                rt.gate.release(identity.doc_id, delivery)
            rt.keeper.forget(ticket)
            rt.tracker.forget(delivery)
