"""The job a handler sees: steps, transactional steps, the outbox and heartbeats.

Every write goes through the job's :class:`~pubsub_worker._job.fencing.FencedDocument`,
conditioned on the version of our previous write. A step's record is
committed lazily: just before the next step runs, or with the completion, so
a one-step job costs two writes (claim, complete). The record of step N is
always durable before step N+1 starts, so a crash never re-runs a step that
a later step has built on.

The job document has a budget under Firestore's 1 MiB
(:mod:`pubsub_worker._job.records`): a step whose result would not fit raises
:class:`~pubsub_worker.errors.DocumentTooLarge` before anything is written,
so the job goes to the failure path once, its committed steps kept.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._support.metrics import Counter, Histogram
from pubsub_worker._support.tracing import DeliveryTrace
from pubsub_worker.errors import (
    LostOwnership,
    OutboxUnsent,
    ProcessingTimeout,
    ShuttingDown,
)
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, OutboxEntry, Version

from .claim import now_utc
from .context import JobContext
from .fencing import FencedDocument
from .keys import JobIdentity
from .outbox import Outbox, Outgoing, check_outgoing, entry_changes, escape, unsent
from .records import Budget, Recorded, TransactionParts, check_step_name, encode

__all__ = ["Job"]


_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")


class Job:
    """One claimed job, handed to the callback as its second argument.

    Use it from the callback's thread. ``heartbeat()`` may also be called
    from another thread.
    """

    def __init__(
        self,
        *,
        identity: JobIdentity,
        delivery: Delivery,
        record: JobRecord,
        version: Version,
        context: JobContext,
        log: logging.LoggerAdapter[logging.Logger],
        trace: DeliveryTrace | None = None,
    ) -> None:
        self._identity = identity
        self._trace = trace
        self._delivery = delivery
        self._ctx = context
        self._log = log
        self._epoch = record.epoch
        self._attempt = record.attempts
        self._steps: dict[str, str] = {name: r.result for name, r in record.steps.items()}
        self._outbox = Outbox(
            unsent(record.outbox),
            publish=context.publish,
            timeout_s=context.io_timeout_s,
            metrics=context.metrics,
            hooks=context.hooks,
            log=log,
        )
        self._budget = Budget(record)
        self._doc = FencedDocument(
            store=context.store,
            doc_id=identity.doc_id,
            epoch=record.epoch,
            delivery=delivery.digest,
            version=version,
            lease_s=context.lease_s,
            on_lost=self._lose,
            on_rejected=lambda: context.metrics.inc(Counter.STALE_COMMITS),
        )
        self._current_step: str | None = None
        self._step_outbox: list[Outgoing] = []
        self._publishes = 0
        self._finished: str | None = None
        self._returned = False  # the handler's return (or ack/nack) decided the outcome
        self._concluding = False  # the final write (complete, release, fail) has begun
        self._transacting = False  # a transactional step is between its parts and its finish
        self._renewing = threading.Lock()  # one lease renewal of the keeper's at a time
        self.stop_error: LostOwnership | None = None
        """The stop signal this job raised to its handler, if any: it decides the outcome."""
        self.last_progress = time.monotonic()
        self.abandoned = threading.Event()
        """Set by the lease keeper when the job ran past ``MAX_PROCESSING_SECONDS``."""
        self.held = False
        """The callback returned without ``ack()`` or ``nack()``: the message is in the user's
        hands (a hand-off to their own threads). Both leases are kept, as the stock client
        keeps a message's, until it is acked or nacked or the processing cap passes."""

    # -- what the callback sees ---------------------------------------------------

    @property
    def key(self) -> str:
        """The effect key: the key attribute's value, or the message id."""
        return self._identity.key

    @property
    def epoch(self) -> int:
        """The fencing token: grows with every claim. Pass it to sinks that can check it."""
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
    def completed_steps(self) -> tuple[str, ...]:
        """Names of the steps recorded so far (by this or an earlier owner)."""
        return tuple(self._steps)

    def idempotency_key(self, step: str) -> str:
        """A key stable across redeliveries and owners: ``{key}:{step}``.

        ``%`` and ``:`` inside the key or step name are percent-encoded, so two
        different (key, step) pairs never share an idempotency key.

        Give it to a sink that deduplicates (payment APIs, object stores) so
        a step that re-runs after a crash repeats no effect there.
        """
        return f"{escape(self.key)}:{escape(step)}"

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once for this job and return its result.

        If the step was recorded before (by this or an earlier owner), its
        result is returned and ``fn`` does not run. Otherwise ``fn`` runs
        outside any transaction and its result, which must be JSON, is
        committed with a check that this owner still holds the job; if not,
        :class:`LostOwnership` is raised and the result is discarded. The
        result returned is the JSON round trip of ``fn()``, the same value a
        redelivery gets. ``fn`` itself runs at least once: make its external
        effect idempotent with :meth:`idempotency_key`, or fence it with
        :attr:`epoch`.
        """
        recorded = self.open_step(name)
        if recorded is not None:
            return recorded.value  # type: ignore[no-any-return]
        with self.measured(name):
            try:
                value = fn()
            finally:
                self.leave_step()
            return self.record_step(name, value)  # type: ignore[no-any-return]

    def transactional_step(self, name: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(transaction)`` and record the step in the same Firestore transaction.

        ``fn`` receives a ``google.cloud.firestore.Transaction``; the business
        writes it makes through it, the step record and the ownership check
        commit together or not at all: a stale owner's write never lands, and
        the effect happens exactly once. ``fn`` runs *inside* the transaction:
        keep it short, read before you write, and do nothing outside the
        transaction, because it may be run again when the transaction is
        retried on contention (messages given to :meth:`publish` from it are
        queued once, from the attempt that commits). Of the job, call only
        :meth:`publish` from ``fn``. The transaction locks the job document
        while ``fn`` runs: a worker frozen inside ``fn`` blocks the next owner
        until Firestore expires its transaction (60 s idle on the emulator),
        and its commit then fails. Returns the recorded result like :meth:`step`.
        """
        recorded = self.begin_step(name)
        if recorded is not None:
            return recorded.value  # type: ignore[no-any-return]
        parts = self.transaction_parts(name)

        def body(transaction: Any) -> T:
            self.enter_step(name)
            try:
                return fn(transaction)
            finally:
                self.leave_step()

        with self.measured(name):
            self._doc.transact(body, parts.changes, parts.adopt)
            return self.finish_transaction(parts)  # type: ignore[no-any-return]

    def publish(self, topic: str, data: bytes, **attributes: str) -> None:
        """Publish a message exactly once for this job.

        Inside a step, the message is written to the job's outbox in the
        step's commit and published after it. Outside any step, the publish
        is a step of its own (named ``~publish.N`` by its order in the
        handler), committed and then published. Either way the message
        carries the effect key (``{key}:{step}:{n}``) in the attribute named by
        ``PUBSUB_WORKER_OUTBOX_KEY_ATTRIBUTE`` and the step name in
        ``pubsub_worker_step``. An entry that could not be published is
        published again, with the same effect key, before the job completes
        or by the next delivery, so a consumer keyed on that attribute drops
        any duplicate. Raises :class:`~pubsub_worker.errors.LimitExceeded` for
        a message Pub/Sub would refuse (checked now, not after the commit).
        """
        outgoing = self.prepare(topic, data, attributes)
        if self._current_step is None:
            self.step(self.publish_step_name(), lambda: self.queue(outgoing))
            return
        self.queue(outgoing)

    def prepare(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Outgoing:
        """A message for :meth:`publish`, resolved and checked against Pub/Sub's limits."""
        self._check_open()
        if not isinstance(data, bytes):
            raise TypeError("data must be bytes")
        outgoing = Outgoing(self._ctx.topic_path(topic), data, dict(attributes))
        check_outgoing(outgoing, self._ctx.outbox_key_attribute)
        return outgoing

    def publish_step_name(self) -> str:
        """The name of the next step of its own that a publish outside any step becomes."""
        self._publishes += 1
        return f"~publish.{self._publishes}"

    def queue(self, outgoing: Outgoing) -> None:
        """Queue a checked message for the current step (see :meth:`publish`)."""
        self._step_outbox.append(outgoing)

    def commit_publishes(self, outgoing: list[Outgoing]) -> None:
        """Commit messages published outside any step, each a step of its own, and publish them.

        For an ``async def callback(message)`` that acked: what it gave
        ``message.job.publish()`` outside a step is committed before the
        completion. Steps recorded already (by an earlier owner) are skipped.
        """
        for message in outgoing:
            name = self.publish_step_name()
            if name in self._steps:
                continue
            self.enter_step(name)
            self.queue(message)
            self.leave_step()
            self.record_step(name, None)

    def heartbeat(self) -> None:
        """Report progress: the leases are renewed only while a job reports it.

        Call it from long steps. Raises :class:`LostOwnership` if this
        delivery no longer owns the job, so a stale step stops early.
        """
        self._check()
        self._progress()
        if self._doc.lease_due():
            self._doc.write()

    # -- the step protocol: step() above, and awaited piece by piece by AsyncJob ------

    def begin_step(self, name: str) -> Recorded | None:
        """Checks before a step (no I/O); the recorded result if the step is done already."""
        self._check()
        check_step_name(name)
        if self._current_step is not None:
            raise RuntimeError(f"step {name!r} started inside step {self._current_step!r}")
        if name in self._steps:
            self._ctx.metrics.inc(Counter.STEPS_SKIPPED)
            self._log.debug("step %r already recorded; skipped", name)
            return Recorded(json.loads(self._steps[name]))
        return None

    def open_step(self, name: str) -> Recorded | None:
        """:meth:`begin_step`, then commit the previous step's record and enter ``name``."""
        recorded = self.begin_step(name)
        if recorded is not None:
            return recorded
        if self._doc.staged((s.STEPS,)):
            self._doc.write()  # the previous step's record is durable before this step runs
        self.enter_step(name)
        return None

    @contextmanager
    def measured(self, name: str) -> Iterator[None]:
        """A step's span (under the delivery's) and its duration, around its run and record."""
        start = time.monotonic()
        trace = self._trace
        with trace.step(name) if trace is not None else nullcontext():
            yield
        self._ctx.metrics.observe(Histogram.STEP_DURATION, time.monotonic() - start, step=name)

    @property
    def unsent_count(self) -> int:
        """Committed outbox entries not published yet."""
        return self._outbox.pending

    def enter_step(self, name: str) -> None:
        """From now on, :meth:`publish` queues messages for step ``name``."""
        self._current_step, self._step_outbox = name, []

    def leave_step(self) -> None:
        """The step's function returned or raised."""
        self._current_step = None

    def record_step(self, name: str, value: Any) -> Any:
        """Stage the step's record (written now if it has outbox entries); its JSON round trip."""
        result = encode(name, value)
        changes, entries = self.outbox_changes(name)
        self._budget.check(name, result, entries)
        self._budget.add(name, result, entries)
        self._ctx.metrics.inc(Counter.STEPS_RUN)
        self._steps[name] = result
        self._doc.stage({(s.STEPS, name): self.step_record(result), **changes})
        self._progress()
        if entries:
            self._doc.write()  # an outbox entry is durable before it is published
            self._ctx.hooks.after_commit(self.key, name)
            self._outbox.add(entries)
            self._try_publish_unsent()
        elif self._doc.lease_due() and self._ctx.tracker.is_current(self._delivery):
            # Progress renews the Firestore lease whether or not the record had to be written
            # now: a record kept for the next write would leave the lease as the claim set it.
            self._doc.write()
        return json.loads(result)

    def transaction_parts(self, name: str) -> TransactionParts:
        """What transactional step ``name`` writes with the job; how a lost reply is adopted."""
        self._transacting = True  # an awaited transaction holds no lock: no renewal meanwhile
        return TransactionParts(self, name)

    def finish_transaction(self, parts: TransactionParts) -> Any:
        """After the transaction committed: bookkeeping, then publish its outbox entries."""
        self._transacting = False
        self._budget.add(parts.name, parts.result, parts.committed)  # checked in the transaction
        self._steps[parts.name] = parts.result
        self._ctx.metrics.inc(Counter.STEPS_RUN)
        self._ctx.hooks.after_commit(self.key, parts.name)
        self._progress()
        self._outbox.add(parts.committed)
        self._try_publish_unsent()
        return json.loads(parts.result)

    @property
    def document(self) -> FencedDocument:
        """The job's fenced document (for the async transactional step)."""
        return self._doc

    def step_record(self, result: str) -> dict[str, Any]:
        """The stored record of a step with ``result``, at this epoch."""
        return {"result": result, "epoch": self._epoch, "at": now_utc()}

    def outbox_changes(self, step: str) -> tuple[dict[tuple[str, ...], Any], list[OutboxEntry]]:
        """The outbox writes of the current step's queued messages, and their entries."""
        outgoing, self._step_outbox = self._step_outbox, []
        return entry_changes(self.key, step, outgoing, self._ctx.outbox_key_attribute)

    def check_budget(self, name: str, result: str, entries: list[OutboxEntry]) -> None:
        """:class:`DocumentTooLarge` unless step ``name`` fits the document's budget."""
        self._budget.check(name, result, entries)

    @property
    def current_step(self) -> str | None:
        """The step whose function is running, if any."""
        return self._current_step

    # -- what the worker uses -----------------------------------------------------

    @property
    def identity(self) -> JobIdentity:
        """Key, document id and payload digest."""
        return self._identity

    @property
    def document_room(self) -> int:
        """Bytes a failed record may still add to the job document."""
        return self._budget.room

    def publish_unsent(self) -> None:
        """Publish every committed, unsent outbox entry; :class:`OutboxUnsent` if one fails."""
        self._outbox.send(self.key, before_each=self._check_owner, sent=self._mark_sent)

    def _mark_sent(self, entry: OutboxEntry) -> None:
        self._doc.stage({(s.OUTBOX, entry.id, "sent"): True})

    def complete(self) -> None:
        """Publish what is unsent, then commit the completion (and any pending step record).

        Not stopped by the processing cap or a shutdown (the work is done);
        raises :class:`OutboxUnsent` if an entry cannot be published yet and
        :class:`LostOwnership` if another owner holds the job.
        """
        self._check_owner()
        self.publish_unsent()
        self._concluding = True
        self._doc.complete(retention_s=self._ctx.retention_s)
        self._finished = "completed"

    def release(self, error: str | None, *, count_attempt: bool) -> None:
        """Give the job back for another delivery, keeping the steps recorded so far.

        ``count_attempt=False`` (a shutdown) gives the attempt back too.
        Raises :class:`LostOwnership` if another owner took it meanwhile.
        """
        attempts = self._attempt if count_attempt else max(self._attempt - 1, 0)
        self._concluding = True
        self._doc.release(error=error, attempts=attempts)
        self._finished = "released"

    def fail(self, reason: str, error: str, extra: Mapping[str, Any]) -> None:
        """Record the job as failed (the failure path); raises if not the owner."""
        self._concluding = True
        self._doc.fail(reason=reason, error=error, extra=extra, retention_s=self._ctx.retention_s)
        self._finished = "failed"

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
        nothing once the job is finished, stopped or superseded; a write refused by
        another owner marks the job lost (its next boundary raises).
        """
        if not self._renewing.acquire(blocking=False):
            return  # the previous renewal is still under way
        try:
            if self.stop_error is not None:
                return
            if not self._ctx.tracker.is_current(self._delivery):
                return
            if self.store_lease_due:
                self._doc.write()
        except LostOwnership:
            pass  # recorded by the document's on_lost: the handler stops at its next boundary
        except Exception as exc:  # noqa: BLE001 - the next renewal or step tries again
            self._log.warning("lease renewal of the job document failed: %s", exc)
        finally:
            self._renewing.release()

    # -- internals ----------------------------------------------------------------

    def _check_owner(self) -> None:
        if self._finished is not None:
            raise RuntimeError(f"the job is already {self._finished}; no more steps")
        if self.stop_error is not None and not isinstance(
            self.stop_error, ProcessingTimeout | ShuttingDown
        ):
            raise self.stop_error
        if not self._ctx.tracker.is_current(self._delivery):
            lost = self._delivery.lost.is_set()
            raise self._lose(
                self._delivery.lost_why if lost else "a newer delivery of this message exists"
            )

    def _check_open(self) -> None:
        if self._returned:
            raise RuntimeError(
                "the handler already returned (or acked or nacked): its outcome is decided, "
                "and job calls after it are refused"
            )

    def _check(self) -> None:
        self._check_open()
        self._check_owner()
        if self.abandoned.is_set():
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

    def _progress(self) -> None:
        self.last_progress = time.monotonic()

    def _try_publish_unsent(self) -> None:
        """Publish now if possible; a failure leaves the entry for the completion to retry."""
        try:
            self.publish_unsent()
        except OutboxUnsent as exc:
            self._log.warning("%s; published again before the job completes", exc)
