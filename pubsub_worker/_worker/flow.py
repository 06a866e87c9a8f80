"""One delivery, from receipt to its outcome: key, gate, claim, handler, conclusion.

Every way a delivery can end goes through :meth:`DeliveryFlow.conclude`,
once: :func:`~pubsub_worker._worker.outcome.decide` picks the outcome from what
happened, :meth:`DeliveryFlow.carry_out` makes the write it needs (complete,
release, fail) and decides again if that write fails, and
:func:`~pubsub_worker._worker.settle.settle` acks, nacks, defers or drops. The ack
is always the last thing done, after the job's record is durable.

A handler that returned is concluded on the runtime's
:class:`~pubsub_worker._worker.completer.Completer` (:meth:`DeliveryFlow.conclude_later`)
and its callback thread is free; the key stays held and the delivery
tracked until the conclusion is done (:meth:`DeliveryFlow.end`). A delivery
whose callback handed the message to its own threads is *held*
(:meth:`DeliveryFlow.hold`) until their ``ack()`` or ``nack()``; whoever
concludes a detached delivery ends it.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._delivery.lease import Ticket
from pubsub_worker._job.claim import Claim, ClaimKind
from pubsub_worker._job.keys import JobIdentity
from pubsub_worker._job.steps import JobCore
from pubsub_worker._support.logs import JobLogger
from pubsub_worker._support.metrics import Counter
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker.errors import LostOwnership, ProcessingTimeout

from . import report
from .claiming import claim_job, claim_request, enter_gate, identify, wait_for_order
from .outcome import Decision, Happened, Outcome, Phase, Settled, decide
from .runtime import Runtime
from .settle import SettledAnswer, ack_early, note_order, settle

__all__ = ["DeliveryFlow", "RunHandler"]

RunHandler = Callable[[Message, JobCore, "DeliveryFlow"], None]
"""Runs the user's handler for a claimed job and concludes the delivery through the flow:
``conclude`` (here, now), ``conclude_later`` (on the completer, for a handler that
returned) or ``hold`` (the message handed to the user's own threads)."""

_WRITE_TRIES = sum(1 for outcome in Outcome if outcome.write is not None)
"""A failed write is decided again, at most this many times (once per writing outcome)."""


class DeliveryFlow:
    """One delivery, from receipt to its outcome. Used by one callback thread."""

    def __init__(
        self,
        rt: Runtime,
        message: Message,
        delivery: Delivery,
        ticket: Ticket,
        log: JobLogger,
        run_handler: RunHandler,
    ) -> None:
        self._run_handler = run_handler
        self._gate_doc: str | None = None  # the key this delivery holds
        self._lock = threading.RLock()  # held while concluding: the first conclusion wins
        self._state = threading.Lock()  # guards _detached, _counted, _ended (never held for I/O)
        self._detached = False  # whoever concludes this delivery ends it, not the callback
        self._counted = False  # concluded elsewhere, counted by the completer (drain waits)
        self._ended = False
        self._rt = rt
        self._message = message
        self._delivery = delivery
        self._ticket = ticket
        self.log = log
        self._identity: JobIdentity | None = None
        self._job: JobCore | None = None
        self._started = time.monotonic()
        self.trace = DeliveryTrace(message, rt.subscription)
        self._published = message.publish_time.timestamp()
        self._arrival = rt.ordering.arrival() if rt.ordering is not None else 0
        self.decision: Decision | None = None
        self._answer = SettledAnswer()

    def run(self, seen: bool) -> None:
        rt, message = self._rt, self._message
        identity = identify(rt, message)
        if isinstance(identity, Happened):
            self.conclude(identity)
            return
        self._identity = identity
        self.log.name_job(identity.key)  # the delivery's one logger, with the engine's
        self._ticket.key = identity.key
        refused = wait_for_order(rt, message, self._published, self._arrival) or enter_gate(
            rt, identity.doc_id, self._delivery
        )
        if refused is not None:
            self.conclude(refused)
            return
        self._gate_doc = identity.doc_id
        # Claim, start, run: a step that cannot go on concludes the delivery and gives None.
        claimed = self._claim(identity, seen)
        job = self._start(identity, claimed) if claimed is not None else None
        if job is not None:
            self._run_handler(message, job, self)

    @property
    def settled(self) -> concurrent.futures.Future[Settled]:
        """Resolves once the delivery is settled on Pub/Sub (an ack: once it is answered)."""
        return self._answer.future()

    @property
    def detached(self) -> bool:
        """Whoever concludes this delivery ends it (its callback thread is done with it)."""
        return self._detached

    def end(self) -> None:
        """The callback is done: give up the key and the delivery, unless a conclusion will."""
        with self._state:
            if self._detached:
                return
        with self._lock:  # a conclusion under way on another thread (an early ack()) ends first
            pass
        self._end()

    def _end(self) -> None:
        with self._state:
            if self._ended:
                return
            self._ended = True
        rt = self._rt
        if self._gate_doc is not None:
            rt.gate.release(self._gate_doc, self._delivery)
            self._gate_doc = None
        rt.keeper.forget(self._ticket)
        rt.tracker.forget(self._delivery)
        if self._counted:
            rt.completer.unhold()

    def detach(self, *, counted: bool = False) -> bool:
        """Whoever concludes will end the delivery; False (nothing changed) if decided.

        ``counted``: the conclusion comes from elsewhere than the completer (the
        user's threads, an I/O thread), so the completer counts it as pending:
        :meth:`~pubsub_worker.ExactlyOnce.drain` waits for it.
        """
        with self._state:
            if self.decision is not None:
                return False
            if counted and not self._counted:
                self._rt.completer.hold()
                self._counted = True
            self._detached = True
            return True

    def hold(self) -> bool:
        """The callback returned without settling: keep the key and both leases until it does.

        The lease keeper renews a held message as the stock client would and,
        past the processing cap, concludes it as a failed attempt. False if the
        delivery was decided meanwhile (an ``ack()`` from another thread won).
        """
        job = self._job
        if job is None or not self.detach(counted=True):
            return False
        job.held = True
        self._rt.keeper.hold(self._ticket, self._expire)
        return True

    def _expire(self) -> None:
        """A held message neither acked nor nacked by the cap: a failed attempt."""
        why = "the message was neither acked nor nacked within MAX_PROCESSING_SECONDS"
        self._conclude_guarded(Happened(Phase.RUN, error=ProcessingTimeout(why)))

    def conclude_later(self, happened: Happened) -> None:
        """Conclude on the completer, which then ends the delivery; here once it is closed.

        A job with outbox entries still unsent is concluded here: its completion
        publishes them first, and a slow publish must hold up its own callback
        thread, never the completer's threads that other completions wait for.
        """
        job = self._job
        if (job is not None and job.unsent_count) or not self._rt.completer.taking:
            self.conclude(happened)
            return
        if not self.detach():
            return
        if not self._rt.completer.submit(lambda: self._conclude_guarded(happened)):
            with self._state:
                self._detached = False  # closed: this (callback) thread concludes and ends it
            self.conclude(happened)

    def _conclude_guarded(self, happened: Happened) -> None:
        """Conclude off the callback thread, where nobody else would see an error."""
        try:
            self.conclude(happened)
        except Exception as exc:  # as on a callback thread: a failed attempt
            self.log.exception("unexpected error concluding the delivery")
            try:
                self.conclude(Happened(Phase.RUN, error=exc))
            except Exception:  # the message comes back when its lease ends
                self.log.exception("unexpected error concluding the delivery as failed")
        finally:
            self._end()

    def _claim(self, identity: JobIdentity, seen: bool) -> Claim | None:
        """The claim of the job (:func:`~.claiming.claim_job`); None if concluded instead."""
        message = self._message
        request = claim_request(self._rt, identity, self._delivery, self.trace.trace_parent())
        redelivery = seen or (message.delivery_attempt or 1) > 1
        got = claim_job(
            self._rt, request, message=message, delivery=self._delivery, redelivery=redelivery
        )
        if isinstance(got, Happened):
            self.conclude(got)
            return None
        return got

    def _start(self, identity: JobIdentity, result: Claim) -> JobCore | None:
        """The claimed job, watched and traced, earlier owners' unsent outbox entries sent.

        None when the delivery was concluded instead: an entry not sent,
        ownership lost, or no attempts left (the failure path).
        """
        rt, settings = self._rt, self._rt.settings
        assert result.record is not None
        assert result.version is not None
        job = JobCore(
            identity=identity,
            delivery=self._delivery,
            record=result.record,
            version=result.version,
            context=rt.context,
            log=self.log,
            trace=self.trace,
        )
        self._job = job
        rt.keeper.attach(self._ticket, job, identity.key)
        self.trace.claimed(
            key=identity.key,
            epoch=job.epoch,
            generation=self._delivery.generation,
            attempt=job.attempt,
            first=result.record.trace_parent,
        )
        try:
            job.publish_unsent()  # earlier owners' entries go out before anything else
        except Exception as exc:  # noqa: BLE001 - OutboxUnsent or LostOwnership
            self.conclude(Happened(Phase.CLAIM, error=exc, claim=ClaimKind.CLAIMED))
            return None
        first = decide(
            Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED),
            attempts=job.attempt,
            max_attempts=settings.max_attempts,
        )
        if first.outcome is not Outcome.RUN:
            self.carry_out(first)
            return None
        return job

    def conclude(self, happened: Happened) -> Decision:
        """Decide the outcome of what happened and carry it out; the first call wins.

        Thread-safe. A detached delivery (concluded off its callback thread) is
        ended here too.
        """
        with self._lock:
            if self.decision is not None:
                return self.decision
            job = self._job
            error = happened.error
            if job is not None and happened.phase is Phase.RUN:
                job.handler_returned()  # nothing the handler's threads do now changes this
                if job.stop_error is not None:
                    error = job.stop_error
            happened = happened.seen(current=self._may_go_on(), error=error)
            attempts = job.attempt if job is not None else 0
            decision = self.carry_out(
                decide(happened, attempts=attempts, max_attempts=self._rt.settings.max_attempts),
                error=error,
            )
        with self._state:
            detached = self._detached
        if detached:
            self._end()
        return decision

    def _may_go_on(self) -> bool:
        """Before its claim, only the latest delivery goes on (an older one stands down);
        once it holds the job, until it is lost (a newer one here adopts it: :meth:`_settle`)."""
        tracker = self._rt.tracker
        if self._job is None:
            return tracker.is_current(self._delivery)
        return tracker.owns(self._delivery)

    def carry_out(self, decision: Decision, *, error: BaseException | None = None) -> Decision:
        """Make the write ``decision`` needs (deciding again if it fails), settle, report.

        ``error``: what ended the handler, logged with its traceback.
        """
        decision = self._write_or_redecide(decision)
        self.decision = decision
        rt = self._rt
        renewal_lost = self._delivery.lost.is_set()
        report.count(
            decision,
            metrics=rt.metrics,
            log=self.log,
            job=self._job,
            renewal_lost=renewal_lost,
            error=error,
        )
        self._settle(decision)
        report.ended(
            decision,
            trace=self.trace,
            metrics=rt.metrics,
            subscription=rt.subscription,
            started=self._started,
        )
        return decision

    def _write_or_redecide(self, decision: Decision) -> Decision:
        """Make the write ``decision`` needs; if it fails, the decision on that failure."""
        rt = self._rt
        attempts = self._job.attempt if self._job is not None else 0
        for _ in range(_WRITE_TRIES):
            try:
                self._write(decision)
                break
            except Exception as exc:  # noqa: BLE001 - a failed write is an event like any other
                if decision.outcome is Outcome.REVIEW and not isinstance(exc, LostOwnership):
                    rt.metrics.inc(Counter.FAILURE_PATH_ERRORS)
                    self.log.error("failure path failed; the message comes back: %s", exc)
                phase = decision.outcome.write
                assert phase is not None  # only a write fails
                current = self._may_go_on()
                decision = decide(
                    Happened(phase, error=exc, current=current),
                    attempts=attempts,
                    max_attempts=rt.settings.max_attempts,
                )
        return decision

    def _settle(self, decision: Decision) -> None:
        """Settle on Pub/Sub, with the hooks around it and the ordering key noted first.

        A delivery that a newer one of its message adopted never settles with
        its stale handle: it is dropped, and the newer one, which waits for
        this one's key, settles from the record this one left.
        """
        rt = self._rt
        if decision.outcome is not Outcome.DROP and not rt.tracker.is_current(self._delivery):
            why = f"{decision.why}; a newer delivery of this message settles it"
            decision = Decision(Outcome.DROP, why, phase=decision.phase)
        key = self._identity.key if self._identity is not None else None
        message_id = self._message.message_id
        if decision.outcome.acks:
            rt.hooks.before_ack(key, message_id)

        def acked(answer: str) -> None:
            rt.hooks.settled(message_id, decision.outcome.value, answer)
            self._answer.set(Settled(decision, answer))

        note_order(
            rt.ordering, self._message, decision, published=self._published, arrival=self._arrival
        )
        settle(
            decision, self._message, metrics=rt.metrics, log=self.log, on_ack=acked, acks=rt.acks
        )
        if not decision.outcome.acks:
            rt.hooks.settled(message_id, decision.outcome.value, None)
            self._answer.set(Settled(decision))

    def _write(self, decision: Decision) -> None:
        job, outcome = self._job, decision.outcome
        if outcome.write is None:
            return
        if outcome is Outcome.REVIEW:
            message = self._message
            self._rt.failure.send(
                message_id=message.message_id,
                data=message.data,
                attributes=message.attributes,
                key=self._identity.key if self._identity is not None else None,
                reason=decision.reason or "error",
                error=decision.error or decision.why,
                job=job,
            )
            return
        if job is None:
            raise LostOwnership("no job was claimed")  # cannot happen: decide needs a claim
        if outcome is Outcome.COMPLETE:
            ack_early(self._message)  # the durable-ack fence: nothing unless a test switched it off
            job.complete()
        else:
            job.release(decision.error, count_attempt=outcome is Outcome.RETRY)
