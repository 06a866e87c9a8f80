"""The job store: one document per job, changed only by atomic conditional writes.

Stored layout (owned here; field names are the constants below)::

    {collection}/{doc_id}                 doc_id = sha256(namespace, subscription, key), hex
      key                  str            the effect key, for humans (at most 1 KiB shown)
      subscription         str            full subscription path
      status               str            running | released | completed | failed
      epoch                int            fencing token: +1 on every successful claim and replay
      owner                str            worker id (host/pid/random) of the current claim
      message_id           str            message id of the owning delivery
      delivery             str            digest of the owning delivery's ack id
      lease_seconds        float          lease length of the current claim; the claim is live
                                          while the document's update time + lease_seconds is
                                          after the read time (both the server's clock), so
                                          every write of the owner renews it
      lease_expires_at     timestamp      the same lease on the writer's wall clock: for humans,
                                          and for stores whose snapshots carry no server times
      attempts             int            claims made so far (not Pub/Sub's best-effort counter)
      payload_sha256       str            same key with another payload is a conflict
      steps.{name}         map            {result: JSON text, epoch: int, at: timestamp}
      outbox.{id}          map            {topic, data: bytes, attributes, step, effect_key, sent}
      error                str            last error (retryable) or the failure reason
      reason               str            why a job failed: error | attempts | permanent |
                                          missing_key | payload_conflict | too_large
      data                 bytes          original message data, kept on a failed record for
                                          replay (None when too large to keep)
      attributes           str            original message attributes as JSON text, on a
                                          failed record
      first_seen_at, updated_at, completed_at, failed_at   timestamps (writer's wall clock)
      replayed_at          timestamp      when ``pubsub-worker jobs replay`` last reset the job
      expire_at            timestamp      retention, refreshed by every claim; point a
                                          Firestore TTL policy at it
      trace_parent         str            W3C traceparent of the job's first delivery (links spans)
      write_id             str            id of the last write, to settle unknown outcomes
      shard                int            shard_of(doc_id), 0 to SHARDS - 1, set at creation: the
                                          listing indexes put it before updated_at, so a
                                          subscription's writes land at SHARDS index ends
                                          instead of one (docs/operations.md, "Capacity")

A store offers three primitives and nothing else; every decision (claim,
commit, complete, fail) is built from them in :mod:`pubsub_worker._job.claim` and
:mod:`pubsub_worker._job.job`, so the same logic runs on every store:

* ``get``: the document, its *version* (an opaque value that changes on
  every write: Firestore's update time, a counter in memory) and, where the
  store has them, the server's read time and the document's update time;
* ``create``: atomic create-if-absent;
* ``update``: atomic update *if the version is still the one given*.

A conditional update is a compare-and-set: a stale owner's write always fails,
because the new owner's claim changed the version. No read-modify-write
transaction is needed on the hot path (see ``docs/architecture.md``).

Leases are judged on the store's clock, never on a worker's: the read time
and update time of one snapshot both come from the server, so a worker whose
wall clock is off neither takes a live job over early nor waits past a lease
that has really expired (:func:`pubsub_worker._job.claim.lease_left_s`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, TypeAlias, runtime_checkable

from pubsub_worker._support.values import quick_init
from pubsub_worker.errors import AlreadyExists, VersionConflict

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
    "LEASE_SECONDS",
    "MESSAGE_ID",
    "OUTBOX",
    "OWNER",
    "PAYLOAD_SHA256",
    "REASON",
    "REPLAYED_AT",
    "REVIEW",
    "SHARD",
    "SHARDS",
    "STATUS",
    "STEPS",
    "SUBSCRIPTION",
    "TRACE_PARENT",
    "UPDATED_AT",
    "WRITE_ID",
    "AlreadyExists",
    "Changes",
    "JobRecord",
    "JobStore",
    "OutboxEntry",
    "Reason",
    "Review",
    "Snapshot",
    "Status",
    "StepRecord",
    "Version",
    "VersionConflict",
    "shard_of",
]

KEY = "key"
SUBSCRIPTION = "subscription"
STATUS = "status"
EPOCH = "epoch"
OWNER = "owner"
MESSAGE_ID = "message_id"
DELIVERY = "delivery"
LEASE_SECONDS = "lease_seconds"
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
REPLAYED_AT = "replayed_at"
EXPIRE_AT = "expire_at"
TRACE_PARENT = "trace_parent"
WRITE_ID = "write_id"
SHARD = "shard"
REVIEW = "review"
"""A failed job's failure message, a :class:`Review` value; absent without a failure topic."""

SHARDS = 16
"""Values of :data:`SHARD`. ``jobs list`` asks for all of them in one ``in`` filter (Firestore
takes at most 30 values); only ever raise it: a document keeps the shard it was created with."""


def shard_of(doc_id: str) -> int:
    """The shard of a document: CRC-32 of its id modulo :data:`SHARDS`; stable across processes."""
    return zlib.crc32(doc_id.encode("utf-8", "surrogatepass")) % SHARDS


Version: TypeAlias = object
"""Opaque document version; equal versions mean no write happened in between."""

Changes: TypeAlias = Mapping[tuple[str, ...], Any]
"""Field path (as a tuple of names, any characters allowed) to new value."""


class Status(str, Enum):
    """Where a job stands."""

    RUNNING = "running"
    """Claimed by ``owner`` at ``epoch`` while its lease is live: ``lease_seconds`` after the
    document's last update, on the server's clock."""
    RELEASED = "released"
    """Given back after a retryable failure or a shutdown; the next delivery claims it."""
    COMPLETED = "completed"
    """Done; a redelivery is acked without running anything."""
    FAILED = "failed"
    """In the reviewed failure path; a redelivery is acked. ``jobs replay`` revives it."""


class Review(str, Enum):
    """Where a failed job's failure message stands (field :data:`REVIEW`)."""

    PENDING = "pending"
    """The failed record is written; the failure message is not published yet."""
    SENT = "sent"
    """The failure message is published."""


class Reason:
    """Why a job went to the failure path (field :data:`REASON`, and the failure message's
    ``reason`` attribute)."""

    ATTEMPTS = "attempts"
    """It failed ``MAX_ATTEMPTS`` times."""
    PERMANENT = "permanent"
    """User code raised ``PermanentError``."""
    TOO_LARGE = "too_large"
    """A step's result or an outbox entry would not fit in the job document."""
    LIMITS = "limits"
    """A message the job would publish breaks Pub/Sub's limits."""
    MISSING_KEY = "missing_key"
    """The configured key attribute was missing or empty."""
    PAYLOAD_CONFLICT = "payload_conflict"
    """The key was already used for a different payload."""


@dataclass(frozen=True)
class Snapshot:
    """A document as read: its fields, its version and the server's times.

    ``read_time`` (when the server read the document) and ``update_time``
    (when it was last written) are on the store's clock, so their difference
    is the same whatever a worker's wall clock says. A store that has no
    such clock leaves them ``None``; leases are then judged on the wall clock.
    """

    fields: dict[str, Any]
    version: Version
    read_time: datetime | None = None
    update_time: datetime | None = None


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


@quick_init
@dataclass(frozen=True)
class JobRecord:
    """The parsed job document (or failed record); missing fields read as their defaults."""

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
    lease_s: float | None = None
    """Lease length of the current claim, in seconds; ``None`` on documents older than it."""
    key: str | None = None
    subscription: str | None = None
    reason: str | None = None
    data: bytes | None = None
    """Original message data of a failed record; ``None`` when it was too large to keep."""
    attributes: dict[str, str] | None = field(default_factory=dict)
    """Original message attributes of a failed record; ``None`` when they are unreadable."""
    failed_at: datetime | None = None
    replayed_at: datetime | None = None
    trace_parent: str | None = None
    """The first delivery's span context (W3C ``traceparent``), linked by later ones."""
    review: str | None = None
    """A failed job's failure message: ``pending`` (recorded, not yet published) or ``sent``."""

    @property
    def review_pending(self) -> bool:
        """Failed, and its failure message is still to be published."""
        return self.status is Status.FAILED and self.review == Review.PENDING.value

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
        lease_s = fields.get(LEASE_SECONDS)
        data = fields.get(DATA)
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
            lease_s=float(lease_s) if lease_s is not None else None,
            key=fields.get(KEY),
            subscription=fields.get(SUBSCRIPTION),
            reason=fields.get(REASON),
            data=bytes(data) if data is not None else None,
            attributes=_parse_attributes(fields.get(ATTRIBUTES)),
            failed_at=fields.get(FAILED_AT),
            replayed_at=fields.get(REPLAYED_AT),
            trace_parent=fields.get(TRACE_PARENT),
            review=fields.get(REVIEW),
        )


def _parse_attributes(raw: Any) -> dict[str, str] | None:
    """Attributes as stored (JSON text; a map is read too); ``None`` unless str to str."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return None
    return dict(raw)


@runtime_checkable
class JobStore(Protocol):
    """Where job documents live. Each method is one atomic operation on one document.

    Implementations retry transient errors themselves and settle a write
    whose outcome is unknown (timeout, cut connection) by reading the
    document back and comparing its ``write_id``: a write is never blindly
    applied twice. Exhausted retries raise :class:`~pubsub_worker.errors.StoreError`.
    """

    def get(self, doc_id: str) -> Snapshot | None:
        """The document, or ``None`` when it does not exist.

        A store with a clock of its own (Firestore's) fills the snapshot's
        ``read_time`` and ``update_time``; leases are judged on them.
        """
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
