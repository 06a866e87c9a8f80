"""A claimed job: steps, heartbeats and the writes that fence a stale owner out.

Every write of a job is an update conditioned on the version our previous
write returned (:mod:`pubsub_worker.store`). A step's record is committed
lazily: just before the next step runs, or together with the completion, so
a one-step job costs two writes (claim, complete). The record of step N is
always durable before step N+1 starts, so a crash never re-runs a step that
a later step has built on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from . import store as s
from .claim import now_utc
from .deliveries import Delivery, DeliveryTracker
from .errors import (
    LostOwnership,
    PermanentError,
    ProcessingTimeout,
    ShuttingDown,
    StoreError,
)
from .keys import JobIdentity
from .metrics import Counter, Metrics
from .store import JobRecord, JobStore, Status, TransactionalStore, Version, VersionConflict

__all__ = ["Job", "JobContext", "Publish"]

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")

Publish = Callable[[str, bytes, Mapping[str, str]], "Future[str]"]
"""Publishes ``(topic_path, data, attributes)``; the future resolves to the message id."""

MAX_STEP_NAME_BYTES = 256
MAX_RESULT_BYTES = 256 * 1024
MAX_OUTBOX_DATA_BYTES = 256 * 1024
MAX_ATTRIBUTE_VALUE_BYTES = 1024
STEP_ATTRIBUTE = "pubsub_worker_step"


@dataclass(frozen=True)
class JobContext:
    """What a job needs from the worker that runs it."""

    store: JobStore
    tracker: DeliveryTracker
    metrics: Metrics
    publish: Publish
    topic_path: Callable[[str], str]
    lease_s: float
    retention_s: float
    io_timeout_s: float
    outbox_key_attribute: str
    stopping: threading.Event
    """Set when in-flight jobs must stop at their next boundary (shutdown grace is over)."""


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
    ) -> None:
        self._identity = identity
        self._delivery = delivery
        self._ctx = context
        self._log = log
        self._epoch = record.epoch
        self._attempt = record.attempts
        self._steps: dict[str, str] = {name: r.result for name, r in record.steps.items()}
        self._unsent = [entry for entry in record.outbox.values() if not entry.sent]
        self._lock = threading.RLock()  # guards _version, _pending, _last_write
        self._version: Version | None = version
        self._pending: dict[tuple[str, ...], Any] = {}
        self._last_write = time.monotonic()
        self._current_step: str | None = None
        self._step_outbox: list[tuple[str, bytes, dict[str, str]]] = []
        self._lost = False
        self._finished: str | None = None
        self.started = time.monotonic()
        self.last_progress = self.started
        self.abandoned = threading.Event()
        """Set by the lease keeper when the job ran past ``MAX_PROCESSING_SECONDS``."""

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
        return f"{_escape(self.key)}:{_escape(step)}"

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
        self._check()
        _check_step_name(name)
        if name in self._steps:
            self._ctx.metrics.inc(Counter.STEPS_SKIPPED)
            self._log.debug("step %r already recorded; skipped", name)
            return json.loads(self._steps[name])  # type: ignore[no-any-return]
        if self._current_step is not None:
            raise RuntimeError(f"step {name!r} started inside step {self._current_step!r}")
        if any(path[0] == s.STEPS for path in self._pending):
            self._write({})  # the previous step's record is durable before this step runs
        self._current_step, self._step_outbox = name, []
        try:
            value = fn()
            result = _encode(name, value)
        finally:
            self._current_step = None
        self._ctx.metrics.inc(Counter.STEPS_RUN)
        outbox, entries = self._outbox_changes(name)
        with self._lock:
            self._steps[name] = result
            self._pending[(s.STEPS, name)] = self._step_record(result)
            self._pending.update(outbox)
        self._progress()
        if outbox:
            self._write({})
            self._unsent.extend(entries)  # committed: now they may be published
            self._publish_unsent()
        return json.loads(result)  # type: ignore[no-any-return]

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
        self._check()
        _check_step_name(name)
        if name in self._steps:
            self._ctx.metrics.inc(Counter.STEPS_SKIPPED)
            return json.loads(self._steps[name])  # type: ignore[no-any-return]
        store = self._ctx.store
        if not isinstance(store, TransactionalStore):
            raise StoreError(f"{type(store).__name__} cannot run transactional steps")
        encoded: dict[str, str] = {}
        committed: list[s.OutboxEntry] = []  # the outbox entries of the attempt that commits

        def body(transaction: Any) -> T:
            self._current_step, self._step_outbox = name, []
            try:
                return fn(transaction)
            finally:
                self._current_step = None

        def changes(value: Any) -> dict[tuple[str, ...], Any]:
            encoded["result"] = _encode(name, value)
            outbox, committed[:] = self._outbox_changes(name)
            with self._lock:
                merged = dict(self._pending)
            merged[(s.STEPS, name)] = self._step_record(encoded["result"])
            merged.update(outbox)
            merged.update(self._lease_changes())
            return merged

        with self._lock:
            for _ in range(3):
                expected = self._version if self._version is not None else self._resettle()
                try:
                    _, version = store.transact(
                        self._identity.doc_id, expected=expected, body=body, changes=changes
                    )
                except VersionConflict:
                    # Someone wrote the job: a new owner (LostOwnership), or our own commit
                    # whose reply was lost, which recorded the step at our epoch: never run
                    # it again then.
                    record, self._version = self._read_own()
                    done = record.steps.get(name)
                    if done is None or done.epoch != self._epoch:
                        continue
                    encoded["result"], version = done.result, self._version
                    entries = record.outbox.values()
                    committed[:] = [e for e in entries if e.step == name and not e.sent]
                break
            else:
                raise self._lose("the transactional step kept conflicting with another writer")
            self._version = version
            self._pending.clear()
            self._last_write = time.monotonic()
            self._steps[name] = encoded["result"]
            self._unsent.extend(committed)
        self._ctx.metrics.inc(Counter.STEPS_RUN)
        self._progress()
        self._publish_unsent()
        return json.loads(encoded["result"])  # type: ignore[no-any-return]

    def publish(self, topic: str, data: bytes, **attributes: str) -> None:
        """Publish a message when the current step commits; call it inside a step.

        The message is written to the job's outbox in the step's commit and
        published after it, with the effect key (``{key}:{step}:{n}``) in the
        attribute named by ``PUBSUB_WORKER_OUTBOX_KEY_ATTRIBUTE`` and the step
        name in ``pubsub_worker_step``. A redelivery publishes only entries not
        marked sent, with the same effect key, so a consumer keyed on that
        attribute drops the duplicate: exactly once end to end.
        """
        if self._current_step is None:
            raise RuntimeError("job.publish() must be called inside job.step()")
        if not isinstance(data, bytes):
            raise TypeError("data must be bytes")
        if len(data) > MAX_OUTBOX_DATA_BYTES:
            raise ValueError(f"outbox messages are limited to {MAX_OUTBOX_DATA_BYTES} bytes")
        self._step_outbox.append((self._ctx.topic_path(topic), data, dict(attributes)))

    def heartbeat(self) -> None:
        """Report progress: the leases are renewed only while a job reports it.

        Call it from long steps. Raises :class:`LostOwnership` if this
        delivery no longer owns the job, so a stale step stops early.
        """
        self._check()
        self._progress()
        if time.monotonic() - self._last_write > self._ctx.lease_s / 3:
            self._write({})

    # -- what the worker uses -----------------------------------------------------

    @property
    def delivery(self) -> Delivery:
        """The delivery this job runs on."""
        return self._delivery

    @property
    def identity(self) -> JobIdentity:
        """Key, document id and payload digest."""
        return self._identity

    def check(self) -> None:
        """Raise :class:`LostOwnership` (or a subclass) if this job must stop now."""
        self._check()

    def publish_unsent(self) -> None:
        """Publish outbox entries an earlier owner committed but did not mark sent."""
        self._publish_unsent()

    def complete(self) -> None:
        """Commit the completion (and any pending step record); raises if not the owner."""
        self._check()
        now = now_utc()
        self._write(
            {
                (s.STATUS,): Status.COMPLETED.value,
                (s.COMPLETED_AT,): now,
                (s.LEASE_EXPIRES_AT,): None,
                (s.EXPIRE_AT,): now + timedelta(seconds=self._ctx.retention_s),
            }
        )
        self._finished = "completed"

    def release(self, error: str | None, *, count_attempt: bool) -> None:
        """Give the job back for another delivery, keeping the steps recorded so far.

        ``count_attempt=False`` (a shutdown) gives the attempt back too.
        Raises :class:`LostOwnership` if another owner took it meanwhile.
        """
        changes: dict[tuple[str, ...], Any] = {
            (s.STATUS,): Status.RELEASED.value,
            (s.LEASE_EXPIRES_AT,): now_utc(),
            (s.ERROR,): error,
        }
        if not count_attempt:
            changes[(s.ATTEMPTS,)] = max(self._attempt - 1, 0)
        self._write(changes)
        self._finished = "released"

    def fail(self, reason: str, error: str, extra: Mapping[str, Any]) -> None:
        """Record the job as failed (the failure path); raises if not the owner."""
        now = now_utc()
        changes: dict[tuple[str, ...], Any] = {
            (s.STATUS,): Status.FAILED.value,
            (s.REASON,): reason,
            (s.ERROR,): error,
            (s.FAILED_AT,): now,
            (s.LEASE_EXPIRES_AT,): None,
            (s.EXPIRE_AT,): now + timedelta(seconds=self._ctx.retention_s),
        }
        changes.update({(name,): value for name, value in extra.items()})
        self._write(changes)
        self._finished = "failed"

    # -- internals ----------------------------------------------------------------

    def _check(self) -> None:
        if self._finished is not None:
            raise RuntimeError(f"the job is already {self._finished}; no more steps")
        if self._lost:
            raise LostOwnership(f"job {self._identity.doc_id} is owned by another delivery")
        if not self._ctx.tracker.is_current(self._delivery):
            why = (
                "Pub/Sub refused this delivery's ack id"
                if self._delivery.lost.is_set()
                else "a newer delivery of this message exists"
            )
            raise self._lose(why)
        if self.abandoned.is_set():
            raise ProcessingTimeout("the job ran past PUBSUB_WORKER_MAX_PROCESSING_SECONDS")
        if self._ctx.stopping.is_set():
            raise ShuttingDown("the worker is shutting down")

    def _lose(self, why: str) -> LostOwnership:
        self._lost = True
        self._log.warning("lost ownership: %s", why)
        return LostOwnership(why)

    def _progress(self) -> None:
        self.last_progress = time.monotonic()

    def _step_record(self, result: str) -> dict[str, Any]:
        return {"result": result, "epoch": self._epoch, "at": now_utc()}

    def _lease_changes(self) -> dict[tuple[str, ...], Any]:
        now = now_utc()
        return {
            (s.LEASE_EXPIRES_AT,): now + timedelta(seconds=self._ctx.lease_s),
            (s.UPDATED_AT,): now,
        }

    def _outbox_changes(self, step: str) -> tuple[dict[tuple[str, ...], Any], list[s.OutboxEntry]]:
        """The outbox writes of the current step, and its entries (queued once committed)."""
        changes: dict[tuple[str, ...], Any] = {}
        entries: list[s.OutboxEntry] = []
        for index, (topic, data, attributes) in enumerate(self._step_outbox):
            entry_id = hashlib.sha256(f"{step}\0{index}".encode()).hexdigest()[:32]
            effect_key = f"{_escape(self.key)}:{_escape(step)}:{index}"
            if len(effect_key.encode("utf-8", "surrogatepass")) > MAX_ATTRIBUTE_VALUE_BYTES:
                raw = effect_key.encode("utf-8", "surrogatepass")
                effect_key = "sha256:" + hashlib.sha256(raw).hexdigest()
            stamped = {
                **attributes,
                self._ctx.outbox_key_attribute: effect_key,
                STEP_ATTRIBUTE: step[:MAX_ATTRIBUTE_VALUE_BYTES],
            }
            entry = {
                "topic": topic,
                "data": data,
                "attributes": stamped,
                "step": step,
                "effect_key": effect_key,
                "sent": False,
            }
            changes[(s.OUTBOX, entry_id)] = entry
            entries.append(s.OutboxEntry(entry_id, topic, data, stamped, step, sent=False))
        self._step_outbox = []
        return changes, entries

    def _publish_unsent(self) -> None:
        while self._unsent:
            entry = self._unsent[0]
            self._check()
            future = self._ctx.publish(entry.topic, entry.data, entry.attributes)
            message_id = future.result(timeout=self._ctx.io_timeout_s)
            self._ctx.metrics.inc(Counter.OUTBOX_PUBLISHED)
            self._log.info(
                "published outbox entry of step %r to %s as %s", entry.step, entry.topic, message_id
            )
            with self._lock:
                self._pending[(s.OUTBOX, entry.id, "sent")] = True
            self._unsent.pop(0)

    def _write(self, changes: Mapping[tuple[str, ...], Any]) -> None:
        """Commit pending records plus ``changes``, conditioned on our last version."""
        with self._lock:
            merged = dict(self._pending)
            merged.update(self._lease_changes())
            merged.update(changes)
            for _ in range(3):
                expected = self._version if self._version is not None else self._resettle()
                try:
                    self._version = self._ctx.store.update(
                        self._identity.doc_id, merged, expected=expected
                    )
                except VersionConflict:
                    self._version = None  # settle by reading: still ours, or lost
                    continue
                self._pending.clear()
                self._last_write = time.monotonic()
                return
            raise self._lose("the job document kept changing under this owner")

    def _resettle(self) -> Version:
        """Read the job: if it is still ours, its version; else :class:`LostOwnership`."""
        return self._read_own()[1]

    def _read_own(self) -> tuple[JobRecord, Version]:
        """The job as read, with its version, if it is still ours; else :class:`LostOwnership`."""
        snap = self._ctx.store.get(self._identity.doc_id)
        if snap is None:
            raise self._lose("the job document is gone")
        record = JobRecord.parse(snap.fields)
        if (
            record.epoch != self._epoch
            or record.status is not Status.RUNNING
            or record.delivery != self._delivery.digest
        ):
            raise self._lose(f"the job was claimed at epoch {record.epoch} (ours: {self._epoch})")
        return record, snap.version


def _escape(part: str) -> str:
    """``%`` and ``:`` percent-encoded, so ``key:step`` joins are unambiguous.

    Keys and step names without those characters are unchanged; with them,
    key ``a:b`` + step ``c`` and key ``a`` + step ``b:c`` no longer meet.
    """
    return part.replace("%", "%25").replace(":", "%3A")


def _check_step_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("a step name is a non-empty string")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_STEP_NAME_BYTES:
        raise ValueError(f"step names are at most {MAX_STEP_NAME_BYTES} bytes")


def _encode(step: str, value: Any) -> str:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"the result of step {step!r} is not JSON: {exc}") from exc
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise PermanentError(
            f"the result of step {step!r} is {len(text)} bytes; at most {MAX_RESULT_BYTES} "
            "are recorded (store large outputs elsewhere and return their reference)"
        )
    return text
