"""The job store: one document per job, changed only by atomic conditional writes.

Stored layout (owned here; field names are the constants below)::

    {collection}/{doc_id}                 doc_id = sha256(namespace, subscription, key), hex
      key                  str            the effect key, for humans (at most 1 KiB shown)
      subscription         str            full subscription path
      status               str            running | released | completed | failed
      epoch                int            fencing token: +1 on every successful claim
      owner                str            worker id (host/pid/random) of the current claim
      message_id           str            message id of the owning delivery
      delivery             str            digest of the owning delivery's ack id
      lease_expires_at     timestamp      claim is live until then; renewed only on progress
      attempts             int            claims made so far (not Pub/Sub's best-effort counter)
      payload_sha256       str            same key with another payload is a conflict
      steps.{name}         map            {result: JSON text, epoch: int, at: timestamp}
      outbox.{id}          map            {topic, data: bytes, attributes, step, effect_key, sent}
      error                str            last error (retryable) or the failure reason
      reason               str            why a job failed: error | attempts | permanent |
                                          missing_key | payload_conflict
      data, attributes     bytes, map     original message, kept on a failed record for replay
      first_seen_at, updated_at, completed_at, failed_at   timestamps
      expire_at            timestamp      retention; point a Firestore TTL policy at it
      write_id             str            id of the last write, to settle unknown outcomes

A store offers three primitives and nothing else; every decision (claim,
commit, complete, fail) is built from them in :mod:`pubsub_worker.claim` and
:mod:`pubsub_worker.job`, so the same logic runs on every store:

* ``get``: the document and its *version* (an opaque value that changes on
  every write: Firestore's update time, a counter in memory);
* ``create``: atomic create-if-absent;
* ``update``: atomic update *if the version is still the one given*.

A conditional update is a compare-and-set: a stale owner's write always fails,
because the new owner's claim changed the version. No read-modify-write
transaction is needed on the hot path (see ``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, TypeAlias, runtime_checkable

from .errors import AlreadyExists, VersionConflict

__all__ = [
    "ATTEMPTS",
    "ATTRIBUTES",
    "COMPLETED_AT",
    "DATA",
    "DELIVERY",
    "EPOCH",
    "ERROR",
    "EXPIRE_AT",
    "FAILED_AT",
    "FIRST_SEEN_AT",
    "KEY",
    "LEASE_EXPIRES_AT",
    "MESSAGE_ID",
    "OUTBOX",
    "OWNER",
    "PAYLOAD_SHA256",
    "REASON",
    "STATUS",
    "STEPS",
    "SUBSCRIPTION",
    "UPDATED_AT",
    "WRITE_ID",
    "AlreadyExists",
    "Changes",
    "JobRecord",
    "JobStore",
    "OutboxEntry",
    "Snapshot",
    "Status",
    "StepRecord",
    "TransactionalStore",
    "Version",
    "VersionConflict",
]

KEY = "key"
SUBSCRIPTION = "subscription"
STATUS = "status"
EPOCH = "epoch"
OWNER = "owner"
MESSAGE_ID = "message_id"
DELIVERY = "delivery"
LEASE_EXPIRES_AT = "lease_expires_at"
ATTEMPTS = "attempts"
PAYLOAD_SHA256 = "payload_sha256"
STEPS = "steps"
OUTBOX = "outbox"
ERROR = "error"
REASON = "reason"
DATA = "data"
ATTRIBUTES = "attributes"
FIRST_SEEN_AT = "first_seen_at"
UPDATED_AT = "updated_at"
COMPLETED_AT = "completed_at"
FAILED_AT = "failed_at"
EXPIRE_AT = "expire_at"
WRITE_ID = "write_id"

Version: TypeAlias = object
"""Opaque document version; equal versions mean no write happened in between."""

Changes: TypeAlias = Mapping[tuple[str, ...], Any]
"""Field path (as a tuple of names, any characters allowed) to new value."""


class Status(str, Enum):
    """Where a job stands."""

    RUNNING = "running"
    """Claimed by ``owner`` at ``epoch`` until ``lease_expires_at``."""
    RELEASED = "released"
    """Given back after a retryable failure or a shutdown; the next delivery claims it."""
    COMPLETED = "completed"
    """Done; a redelivery is acked without running anything."""
    FAILED = "failed"
    """In the reviewed failure path; a redelivery is acked. ``pubsub-worker replay`` revives it."""


@dataclass(frozen=True)
class Snapshot:
    """A document as read: its fields and its version."""

    fields: dict[str, Any]
    version: Version


@dataclass(frozen=True)
class StepRecord:
    """A step committed by the owner at ``epoch``; ``result`` is JSON text."""

    result: str
    epoch: int


@dataclass(frozen=True)
class OutboxEntry:
    """A message to publish once its step is committed."""

    id: str
    topic: str
    data: bytes
    attributes: dict[str, str]
    step: str
    sent: bool


@dataclass(frozen=True)
class JobRecord:
    """The parsed job document."""

    status: Status
    epoch: int
    owner: str | None
    message_id: str | None
    delivery: str | None
    lease_expires_at: datetime | None
    attempts: int
    payload_sha256: str | None
    steps: dict[str, StepRecord] = field(default_factory=dict)
    outbox: dict[str, OutboxEntry] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def parse(cls, fields: Mapping[str, Any]) -> JobRecord:
        """Read the stored layout; unknown fields are ignored."""
        steps = {
            name: StepRecord(result=str(value.get("result", "null")), epoch=int(value["epoch"]))
            for name, value in (fields.get(STEPS) or {}).items()
        }
        outbox = {
            entry_id: OutboxEntry(
                id=entry_id,
                topic=str(value["topic"]),
                data=bytes(value.get("data") or b""),
                attributes=dict(value.get("attributes") or {}),
                step=str(value.get("step", "")),
                sent=bool(value.get("sent", False)),
            )
            for entry_id, value in (fields.get(OUTBOX) or {}).items()
        }
        return cls(
            status=Status(fields.get(STATUS, Status.RELEASED.value)),
            epoch=int(fields.get(EPOCH, 0)),
            owner=fields.get(OWNER),
            message_id=fields.get(MESSAGE_ID),
            delivery=fields.get(DELIVERY),
            lease_expires_at=fields.get(LEASE_EXPIRES_AT),
            attempts=int(fields.get(ATTEMPTS, 0)),
            payload_sha256=fields.get(PAYLOAD_SHA256),
            steps=steps,
            outbox=outbox,
            error=fields.get(ERROR),
        )


@runtime_checkable
class JobStore(Protocol):
    """Where job documents live. Each method is one atomic operation on one document.

    Implementations retry transient errors themselves and settle a write
    whose outcome is unknown (timeout, cut connection) by reading the
    document back and comparing its ``write_id``: a write is never blindly
    applied twice. Exhausted retries raise :class:`~pubsub_worker.errors.StoreError`.
    """

    def get(self, doc_id: str) -> Snapshot | None:
        """The document, or ``None`` when it does not exist."""
        ...

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        """Create the document; atomic. Raises :class:`AlreadyExists` if it exists."""
        ...

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        """Apply ``changes`` iff the document's version is ``expected``; atomic.

        Returns the new version. Raises :class:`VersionConflict` when the
        document changed (or vanished) since ``expected``.
        """
        ...


@runtime_checkable
class TransactionalStore(JobStore, Protocol):
    """A store whose documents can change together with the job in one transaction."""

    def transact(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Any],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """Run ``body(transaction)``, then write ``changes(result)`` to the job; all or nothing.

        The transaction first checks that the job's version is ``expected``
        (else :class:`VersionConflict`). ``body`` may run more than once when
        the transaction is retried on contention. Returns the body's result and
        the job's new version (``None`` if it could not be read back).
        """
        ...
