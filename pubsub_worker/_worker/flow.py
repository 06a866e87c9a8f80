"""One delivery, from receipt to its outcome: key, gate, claim, handler, conclusion.

Every way a delivery can end goes through :meth:`DeliveryFlow.conclude`,
once: :func:`~pubsub_worker._worker.outcome.decide` picks the outcome from what
happened, :meth:`DeliveryFlow.carry_out` makes the write it needs
(:mod:`~pubsub_worker._worker.writes`) and decides again if that write fails, and
:func:`~pubsub_worker._worker.settle.settle` acks, nacks, defers or drops. The ack
is always the last thing done, after the job's record is durable.

A handler that returned is concluded without its callback thread where it
may be (:meth:`DeliveryFlow.conclude_later`): the thread that settles the
completion's write acks (the batching Firestore store), or the runtime's
:class:`~pubsub_worker._worker.completer.Completer` concludes; the key stays
held and the delivery tracked until the conclusion is done. A delivery
whose callback handed the message to its own threads is *held*
(:meth:`DeliveryFlow.hold`) until their ``ack()`` or ``nack()``; whoever
concludes a detached delivery ends it.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from _thread import RLock  # threading.RLock's C lock, without its Python call
from collections.abc import Callable

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._delivery.lease import Ticket
from pubsub_worker._job.claim import Claim
from pubsub_worker._job.core import JobCore
from pubsub_worker._job.fencing import Finish, raising
from pubsub_worker._job.keys import JobIdentity
from pubsub_worker._support.logs import JobLogger
from pubsub_worker._support.metrics import Counter
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker.errors import LostOwnership, ProcessingTimeout

from . import report
from .claiming import claim_job, claim_request, enter_gate, identify, start_job, wait_for_order
from .outcome import Decision, Happened, Outcome, Phase, Settled, decide
from .runtime import Runtime
from .settle import SettledAnswer, ack_early, may_return_unsettled, settle_delivery
from .writes import write_for

__all__ = ["DeliveryFlow", "RunHandler"]

RunHandler = Callable[[Message, JobCore, "DeliveryFlow"], None]
"""Runs the user's handler for a claimed job and concludes the delivery through the flow:
``conclude``, ``conclude_later`` (a handler that returned) or ``hold`` (the message
handed to the user's own threads)."""

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
        self._lock = RLock()  # held while concluding: the first conclusion wins
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
        # A completion under way, not waited for: its decision, and the error the handler raised.
        self._continued: tuple[Decision, BaseException | None] | None = None
        self._answer = SettledAnswer()

    def run(self) -> None:
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
        claimed = self._claim(identity)
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
        """Conclude a handler that returned, off its callback thread where one may.

        Where the store tells when a write is done and nobody counts on the
        callback's return meaning its message is settled
        (:func:`~.settle.may_return_unsettled`), the completion's write is not
        waited for (:meth:`_conclude_continued`). Else on the completer, once opened
        (:func:`pubsub_worker.run`); else here, as does a job with outbox entries unsent
        (a slow publish holds up its own callback thread only)."""
        job = self._job
        if job is not None and job.unsent_count:
            self.conclude(happened)
            return
        if self._rt.continued and may_return_unsettled(self._message, self._rt.completer.taking):
            self._conclude_continued(happened)
            return
        if not self._rt.completer.taking or not self.detach():
            self.conclude(happened)
            return
        if not self._rt.completer.submit(lambda: self._conclude_guarded(happened)):
            with self._state:
                self._detached = False  # closed: this (callback) thread concludes and ends it
            self.conclude(happened)

    def _conclude_continued(self, happened: Happened) -> None:
        """:meth:`conclude`, a completion's write not waited for: :meth:`_completed` goes on
        from its outcome. Any decision but a completion is carried out here."""
        with self._lock:
            if self.decision is not None or self._continued is not None:
                return
            decision, error = self._decided(happened)
            job = self._job
            if decision.outcome is not Outcome.COMPLETE or job is None:
                self.carry_out(decision, error=error)
                return
            if not self.detach(counted=True):
                return
            self._continued = (decision, error)
        ack_early(self._message)  # the durable-ack fence: nothing unless a test switched it off
        try:
            job.complete(then=self._completed)
        except Exception as exc:  # noqa: BLE001 - before the write: an outcome like any other
            self._completed(raising(exc))

    def _completed(self, finish: Finish | None, *, off: bool = False) -> None:
        """The completion's write applied (``finish`` None): settled, reported and ended here,
        on the thread that sent it. Else, on a thread that may wait (``off``), the write
        is settled, decided again if it failed, and carried out."""
        if finish is not None and not off:
            self._rt.completer.run_off(lambda: self._completed(finish, off=True))
            return
        assert self._continued is not None
        decision, error = self._continued
        try:
            if finish is not None:
                decision = self._write_or_redecide(decision, first=finish)
            self._carried_out(decision, error)
        except Exception:  # the message comes back when its lease ends
            self.log.exception("unexpected error concluding the delivery")
        finally:
            self._end()

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

    def _claim(self, identity: JobIdentity) -> Claim | None:
        """The claim of the job (:func:`~.claiming.claim_job`); None if concluded instead."""
        message = self._message
        request = claim_request(self._rt, identity, self._delivery, self.trace.trace_parent())
        redelivery = self._delivery.follows or (message.delivery_attempt or 1) > 1
        got = claim_job(
            self._rt, request, message=message, delivery=self._delivery, redelivery=redelivery
        )
        if isinstance(got, Happened):
            self.conclude(got)
            return None
        return got

    def _start(self, identity: JobIdentity, result: Claim) -> JobCore | None:
        """The claimed job (:func:`~.claiming.start_job`); None if concluded instead."""
        job, instead = start_job(
            self._rt,
            identity,
            result,
            delivery=self._delivery,
            ticket=self._ticket,
            log=self.log,
            trace=self.trace,
        )
        self._job = job
        if isinstance(instead, Happened):
            self.conclude(instead)
        elif instead is not None:
            self.carry_out(instead)
        return job if instead is None else None

    def conclude(self, happened: Happened) -> Decision:
        """Decide the outcome of what happened and carry it out; the first call wins.

        Thread-safe. A detached delivery (concluded off its callback thread) is
        ended here too.
        """
        with self._lock:
            if self.decision is not None:
                return self.decision
            if self._continued is not None:  # a completion under way goes on elsewhere
                return self._continued[0]
            decision, error = self._decided(happened)
            decision = self.carry_out(decision, error=error)
        with self._state:
            detached = self._detached
        if detached:
            self._end()
        return decision

    def _decided(self, happened: Happened) -> tuple[Decision, BaseException | None]:
        """The outcome of what happened, and the error that ended the handler (under the lock)."""
        job = self._job
        error = happened.error
        if job is not None and happened.phase is Phase.RUN:
            job.handler_returned()  # nothing the handler's threads do now changes this
            if job.stop_error is not None:
                error = job.stop_error
        happened = happened.seen(current=self._may_go_on(), error=error)
        attempts = job.attempt if job is not None else 0
        max_attempts = self._rt.settings.max_attempts
        return decide(happened, attempts=attempts, max_attempts=max_attempts), error

    def _may_go_on(self) -> bool:
        """Before its claim, only the latest delivery goes on (an older one stands down); once
        it holds the job, until it is lost (a newer one here adopts it: ``settle_delivery``)."""
        tracker = self._rt.tracker
        if self._job is None:
            return tracker.is_current(self._delivery)
        return tracker.owns(self._delivery)

    def carry_out(self, decision: Decision, *, error: BaseException | None = None) -> Decision:
        """Make the write ``decision`` needs (deciding again if it fails), settle, report.

        ``error``: what ended the handler, logged with its traceback.
        """
        return self._carried_out(self._write_or_redecide(decision), error)

    def _carried_out(self, decision: Decision, error: BaseException | None) -> Decision:
        """After its write: the decision taken, counted, settled on Pub/Sub and reported."""
        self.decision = decision
        rt = self._rt
        lost = self._delivery.lost
        report.count(
            decision,
            metrics=rt.metrics,
            log=self.log,
            job=self._job,
            renewal_lost=lost,
            error=error,
        )
        settle_delivery(
            decision,
            self._message,
            rt=rt,
            delivery=self._delivery,
            key=self._identity.key if self._identity is not None else None,
            answer=self._answer,
            log=self.log,
            order=(self._published, self._arrival),
        )
        report.ended(
            decision,
            trace=self.trace,
            metrics=rt.metrics,
            subscription=rt.subscription,
            started=self._started,
        )
        return decision

    def _write_or_redecide(self, decision: Decision, first: Finish | None = None) -> Decision:
        """Make the write ``decision`` needs; if it fails, the decision on that failure
        (``first``: goes on with that write, its first attempt made already)."""
        rt = self._rt
        attempts = self._job.attempt if self._job is not None else 0
        for _ in range(_WRITE_TRIES):
            try:
                if first is not None:
                    finish, first = first, None
                    finish()
                else:
                    write_for(
                        decision,
                        rt=rt,
                        message=self._message,
                        key=self._identity.key if self._identity is not None else None,
                        job=self._job,
                    )
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
