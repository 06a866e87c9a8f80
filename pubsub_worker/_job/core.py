"""One claimed job as the worker holds it: its steps, its outbox, and its conclusion.

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

:class:`JobCore` is what the worker holds (claim to conclusion: publish the
unsent outbox, complete, release, fail, keep the Firestore lease);
:class:`~pubsub_worker._job.job.Job` and :class:`~pubsub_worker._job.async_job.AsyncJob`
are the handler's faces over it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._support import fences
from pubsub_worker._support.metrics import Counter
from pubsub_worker._support.tracing import DeliveryTrace, MeasuredStep
from pubsub_worker.errors import OutboxUnsent
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, OutboxEntry, Version

from .context import JobContext
from .fencing import Finish, Then
from .keys import JobIdentity
from .lease import now_utc
from .outbox import Outbox, Outgoing, check_outgoing, entry_changes, unsent
from .ownership import JobOwnership
from .records import (
    Budget,
    Recorded,
    StagedStep,
    TransactionParts,
    check_step_name,
    encode,
)

__all__ = ["JobCore"]


_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")


class JobCore(JobOwnership):
    """One claimed job: what :class:`~pubsub_worker._job.job.Job` and
    :class:`~pubsub_worker._job.async_job.AsyncJob` show a handler, and what the worker uses.

    Used from the handler's thread (or the I/O pool of an async handler);
    :meth:`heartbeat` and :meth:`keep_alive` may also be called from another thread.
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
        super().__init__(
            identity=identity,
            delivery=delivery,
            record=record,
            version=version,
            context=context,
            log=log,
        )
        self._trace = trace
        self._steps: dict[str, str] = (
            {name: r.result for name, r in record.steps.items()} if record.steps else {}
        )
        pending = unsent(record.outbox) if record.outbox else None  # most jobs never publish
        self._outbox = Outbox(pending, context, log) if pending else None
        self._budget = Budget(record)
        self._current_step: str | None = None
        self._step_outbox: list[Outgoing] = []
        self._publishes = 0
        self._deferred: list[Outgoing] = []

    # -- what the faces show the handler ----------------------------------------------

    @property
    def completed_steps(self) -> tuple[str, ...]:
        """Names of the steps recorded so far (by this or an earlier owner)."""
        return tuple(self._steps)

    def run_step(self, name: str, fn: Callable[[], T]) -> T:
        """:meth:`pubsub_worker.Job.step`: ``fn`` once, its result recorded."""
        recorded = self.open_step(name)
        if recorded is not None:
            return recorded.value  # type: ignore[no-any-return]
        with self.measured(name):
            try:
                value = fn()
            finally:
                self.leave_step()
            return self.record_step(name, value)  # type: ignore[no-any-return]

    def run_transactional(self, name: str, fn: Callable[[Any], T]) -> T:
        """:meth:`pubsub_worker.Job.transactional_step`: ``fn(transaction)`` with the record."""
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

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> None:
        """:meth:`pubsub_worker.Job.publish`: queued in the current step, else a step of its own."""
        outgoing = self.prepare(topic, data, attributes)
        if self._current_step is None:
            self.run_step(self.publish_step_name(), lambda: self.queue(outgoing))
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

    def defer(self, outgoing: Outgoing) -> None:
        """An async handler's publish outside any step: committed at its next ``await job.*``."""
        self._deferred.append(outgoing)

    def next_deferred(self) -> Outgoing | None:
        """The oldest deferred publish, taken off the queue (None when there is none)."""
        return self._deferred.pop(0) if self._deferred else None

    def take_deferred(self) -> list[Outgoing]:
        """Every deferred publish, handed over (for :meth:`commit_publishes`)."""
        deferred, self._deferred = self._deferred, []
        return deferred

    def heartbeat(self) -> None:
        """Report progress: the leases are renewed only while a job reports it.

        Call it from long steps. Raises :class:`LostOwnership` if this
        delivery no longer owns the job, so a stale step stops early.
        """
        if self.beat():
            self._doc.write()

    def beat(self) -> bool:
        """:meth:`heartbeat` without its write (no I/O); whether the lease is due a write."""
        self._check()
        self._progress()
        return self._doc.lease_due()

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
        if self.record_staged:
            self._doc.write()  # the previous step's record is durable before this step runs
        self.enter_step(name)
        return None

    @property
    def record_staged(self) -> bool:
        """A step's record waits for the next write (:meth:`open_step` writes it first)."""
        return self._doc.staged((s.STEPS,))

    def measured(self, name: str) -> MeasuredStep:
        """A step's span (under the delivery's) and its duration, around its run and record."""
        return MeasuredStep(self._trace, self._ctx.metrics, name)

    @property
    def unsent_count(self) -> int:
        """Committed outbox entries not published yet."""
        return self._outbox.pending if self._outbox is not None else 0

    def _committed(self, entries: list[OutboxEntry]) -> None:
        """Entries whose commit is durable: published by :meth:`publish_unsent`."""
        if self._outbox is None:
            self._outbox = Outbox([], self._ctx, self._log)
        self._outbox.add(entries)

    def enter_step(self, name: str) -> None:
        """From now on, :meth:`publish` queues messages for step ``name``."""
        self._current_step, self._step_outbox = name, []

    def leave_step(self) -> None:
        """The step's function returned or raised."""
        self._current_step = None

    def record_step(self, name: str, value: Any) -> Any:
        """Stage the step's record (written now if it has outbox entries); its JSON round trip."""
        staged = self.stage_step(name, value)
        if staged.write_now:
            self.write_step(name, staged)
        return staged.value

    def stage_step(self, name: str, value: Any) -> StagedStep:
        """:meth:`record_step` up to its write (no I/O): the record staged, what is left."""
        result = encode(name, value)
        changes, entries = self.outbox_changes(name) if self._step_outbox else ({}, [])
        self._budget.take(name, result, entries)
        self._ctx.metrics.inc(Counter.STEPS_RUN)
        self._steps[name] = result
        self._doc.stage({(s.STEPS, name): self.step_record(result), **changes})
        now = self._progress()
        # An outbox entry is durable before it is published. And progress renews the Firestore
        # lease whether or not the record had to be written now: a record kept for the next
        # write would leave the lease as the claim set it.
        write_now = bool(entries) or (
            self._doc.lease_due(now) and self._ctx.tracker.owns(self._delivery)
        )
        return StagedStep(result, entries, write_now, value)

    def write_step(self, name: str, staged: StagedStep) -> None:
        """Write a staged step's record now; then publish its outbox entries, if any."""
        self._doc.write()
        if staged.entries:
            self._ctx.hooks.after_commit(self.key, name)
            self._committed(staged.entries)
            self._try_publish_unsent()

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
        if parts.committed:
            self._committed(parts.committed)
        self._try_publish_unsent()
        return json.loads(parts.result)

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
    def document_room(self) -> int:
        """Bytes a failed record may still add to the job document."""
        return self._budget.room

    def publish_unsent(self) -> None:
        """Publish every committed, unsent outbox entry; :class:`OutboxUnsent` if one fails."""
        if self._outbox is not None:
            self._outbox.send(self.key, before_each=self._check_owner, sent=self._mark_sent)

    def _mark_sent(self, entry: OutboxEntry) -> None:
        self._doc.stage({(s.OUTBOX, entry.id, "sent"): True})

    def complete(self, then: Then | None = None) -> None:
        """Publish what is unsent, then commit the completion (and any pending step record).

        Not stopped by the processing cap or a shutdown (the work is done);
        raises :class:`OutboxUnsent` if an entry cannot be published yet and
        :class:`LostOwnership` if another owner holds the job. Publishing first is
        the ``outbox`` fence (:mod:`pubsub_worker._support.fences`). With ``then``,
        the write is not waited for where the store can tell (``FencedDocument.write_then``).
        """
        self._check_owner()
        if "outbox" not in fences.OFF:  # switched off in a test: completed with entries unsent
            self.publish_unsent()
        self._concluding = True
        if then is None:
            self._doc.complete(retention_s=self._ctx.retention_s)
            self._finished = "completed"
            return

        def done(finish: Finish | None) -> None:
            if finish is None:  # else finish() completes it, or raises why it could not
                self._finished = "completed"
            then(finish)

        self._doc.complete(retention_s=self._ctx.retention_s, then=done)

    def release(self, error: str | None, *, count_attempt: bool) -> None:
        """Give the job back for another delivery, keeping the steps recorded so far.

        ``count_attempt=False`` (a shutdown) gives the attempt back too.
        Raises :class:`LostOwnership` if another owner took it meanwhile.
        """
        self._refuse_if_concluded()
        attempts = self._attempt if count_attempt else max(self._attempt - 1, 0)
        self._concluding = True
        self._doc.release(error=error, attempts=attempts)
        self._finished = "released"

    def fail(self, reason: str, error: str, extra: Mapping[str, Any]) -> None:
        """Record the job as failed (the failure path); raises if not the owner."""
        self._refuse_if_concluded()
        self._concluding = True
        self._doc.fail(reason=reason, error=error, extra=extra, retention_s=self._ctx.retention_s)
        self._finished = "failed"

    # -- internals ----------------------------------------------------------------

    def _refuse_if_concluded(self) -> None:
        """A completed or failed job is never concluded again (nor a released one).

        The flow concludes each delivery once; this keeps a second conclusion of
        one core from writing ``failed`` over its own ``completed`` record.
        """
        if self._finished is not None:
            raise RuntimeError(f"the job is already {self._finished}; it is not concluded again")

    def _try_publish_unsent(self) -> None:
        """Publish now if possible; a failure leaves the entry for the completion to retry."""
        try:
            self.publish_unsent()
        except OutboxUnsent as exc:
            self._log.warning("%s; published again before the job completes", exc)
