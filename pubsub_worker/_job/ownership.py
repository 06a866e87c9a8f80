"""Who owns a claimed job: its fenced document, its stop signals and its Firestore lease.

:class:`JobOwnership` is the part of :class:`~pubsub_worker._job.core.JobCore`
that decides whether this delivery may still act: the checks every step and
heartbeat makes (the handler returned, the job finished, another owner, a
delivery Pub/Sub refused or the keeper gave up, the processing cap, a shutdown;
a newer delivery of the message in this process adopts the job and does not
stop it), and the renewal of the
Firestore lease the lease keeper asks for (:mod:`pubsub_worker._delivery.lease`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._support.metrics import Counter
from pubsub_worker.errors import LostOwnership, ProcessingTimeout, ShuttingDown
from pubsub_worker.stores.base import JobRecord, Version

from .context import JobContext
from .fencing import FencedDocument
from .keys import JobIdentity

__all__ = ["JobOwnership"]


class JobOwnership:
    """A claimed job's owner: its document, its fences and its Firestore lease."""

    def __init__(
        self,
        *,
        identity: JobIdentity,
        delivery: Delivery,
        record: JobRecord,
        version: Version,
        context: JobContext,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self._identity = identity
        self._delivery = delivery
        self._ctx = context
        self._log = log
        self._epoch = record.epoch
        self._attempt = record.attempts
        self._doc = FencedDocument(
            store=context.store,
            doc_id=identity.doc_id,
            epoch=record.epoch,
            delivery=delivery.digest,
            version=version,
            lease_s=context.lease_s,
            # Not ``self._lose``: a bound method would make the document and its owner a
            # cycle, which only the cyclic garbage collector frees (every delivery's objects
            # kept until the next collection, and more collections); weakly, both are freed
            # as the delivery ends.
            on_lost=functools.partial(_lose, weakref.ref(self)),
            on_rejected=lambda: context.metrics.inc(Counter.STALE_COMMITS),
        )
        self._finished: str | None = None
        self._returned = False  # the handler's return (or ack/nack) decided the outcome
        self._concluding = False  # the final write (complete, release, fail) has begun
        self._transacting = False  # a transactional step is between its parts and its finish
        self._renewing = threading.Lock()  # one lease renewal of the keeper's at a time
        self.stop_error: LostOwnership | None = None
        """The stop signal this job raised to its handler, if any: it decides the outcome."""
        self.last_progress = time.monotonic()
        self.abandoned = False
        """Set (True, once) by the lease keeper when the job ran past ``MAX_PROCESSING_SECONDS``."""
        self.held = False
        """The callback returned without ``ack()`` or ``nack()``: the message is in the user's
        hands (a hand-off to their own threads). Both leases are kept, as the stock client
        keeps a message's, until it is acked or nacked or the processing cap passes."""

    # -- who the job is -------------------------------------------------------------

    @property
    def key(self) -> str:
        """The effect key: the key attribute's value, or the message id."""
        return self._identity.key

    @property
    def epoch(self) -> int:
        """The fencing token: grows with every claim."""
        return self._epoch

    @property
    def attempt(self) -> int:
        """Which claim of this job this is, from 1 (counted in the job document)."""
        return self._attempt

    @property
    def message_id(self) -> str:
        """The message id of this delivery."""
        return self._delivery.message_id

    @property
    def identity(self) -> JobIdentity:
        """Key, document id and payload digest."""
        return self._identity

    @property
    def document(self) -> FencedDocument:
        """The job's fenced document (for the async job: its transaction, staging unblocked)."""
        return self._doc

    # -- the outcome and the lease -------------------------------------------------

    @property
    def settling(self) -> bool:
        """The handler's return (or its ``ack()``/``nack()``) decided the outcome, and the
        conclusion that writes it is on its way: progress, for the lease keeper."""
        return self._returned or self._concluding

    def handler_returned(self) -> None:
        """The handler's return (or its ``ack()``/``nack()``) decided the outcome.

        From now on a stray ``job.*`` call (a helper thread winding down) raises
        ``RuntimeError`` and can no longer turn the outcome into a stop.
        """
        self._returned = True
        self.held = False

    @property
    def store_lease_due(self) -> bool:
        """The Firestore lease wants renewing: a third of it passed, with progress since."""
        return (
            not self._concluding
            and not self._transacting
            and self._doc.lease_due()
            and (self.held or self.last_progress > self._doc.written_at)
        )

    def keep_alive(self) -> None:
        """Renew the Firestore lease if a third of it passed and the job progressed since.

        Called by the lease keeper, off the handler's thread, when it renews the
        Pub/Sub lease: the two leases are kept together. A held job (:attr:`held`)
        counts as progressing, as the stock client keeps a message it holds. Does
        nothing once the job is finished, stopped or lost; a write refused by
        another owner marks the job lost (its next boundary raises).
        """
        if not self._renewing.acquire(blocking=False):
            return  # the previous renewal is still under way
        try:
            if self.stop_error is not None:
                return
            if not self._ctx.tracker.owns(self._delivery):
                return
            if self.store_lease_due:
                self._doc.write()
        except LostOwnership:
            pass  # recorded by the document's on_lost: the handler stops at its next boundary
        except Exception as exc:  # noqa: BLE001 - the next renewal or step tries again
            self._log.warning("lease renewal of the job document failed: %s", exc)
        finally:
            self._renewing.release()

    # -- the fences ----------------------------------------------------------------

    def _check_owner(self) -> None:
        if self._finished is not None:
            raise RuntimeError(f"the job is already {self._finished}; no more steps")
        if self.stop_error is not None and not isinstance(
            self.stop_error, ProcessingTimeout | ShuttingDown
        ):
            raise self.stop_error
        if not self._ctx.tracker.owns(self._delivery):
            raise self._lose(self._delivery.lost_why)

    def _check_open(self) -> None:
        if self._returned:
            raise RuntimeError(
                "the handler already returned (or acked or nacked): its outcome is decided, "
                "and job calls after it are refused"
            )

    def _check(self) -> None:
        self._check_open()
        self._check_owner()
        if self.abandoned:
            raise self._stop(ProcessingTimeout("the job ran past MAX_PROCESSING_SECONDS"))
        if self._ctx.stopping.is_set():
            raise self._stop(ShuttingDown("the worker is shutting down"))

    def _stop(self, error: LostOwnership) -> LostOwnership:
        if self.stop_error is None and not self._returned:
            self.stop_error = error
        return error

    def _lose(self, why: str) -> LostOwnership:
        self._log.warning("lost ownership: %s", why)
        error = LostOwnership(why)
        if not self._returned:
            self.stop_error = error  # overrides a cap or a shutdown: nothing can be written now
        return error

    def _progress(self) -> float:
        """The job progressed now (the lease keeper renews its leases); now, monotonic."""
        self.last_progress = now = time.monotonic()
        return now


def _lose(owner: weakref.ref[JobOwnership], why: str) -> LostOwnership:
    """The document's ``on_lost``: its owner's :meth:`JobOwnership._lose`, while it lives."""
    found = owner()
    return LostOwnership(why) if found is None else found._lose(why)
