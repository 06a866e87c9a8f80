"""Claiming a job: one atomic create or compare-and-set per attempt.

A new job is claimed with ``create`` (fails if the document exists), the
common case, in one RPC. An existing job is read, :func:`decide` says what
its state allows, and a take-over is written with ``update`` conditioned on
the version just read: if anyone wrote in between, the claim is decided
again from a fresh read. No lock is held between the read and the write.
The two conditions are the ``claim`` fence (:mod:`pubsub_worker._support.fences`);
another owner's live lease making the claim wait is the ``live-lease`` fence.

Whether a running job's lease is still live is judged on the store's clock
(:mod:`pubsub_worker._job.lease`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from pubsub_worker._support import fences
from pubsub_worker._support.values import quick_init
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import (
    AlreadyExists,
    JobRecord,
    JobStore,
    Status,
    Version,
    VersionConflict,
)

from .keys import JobIdentity, display
from .lease import lease_fields, lease_left_s, now_utc

__all__ = ["Claim", "ClaimKind", "ClaimRequest", "claim", "decide"]

_jitter = random.Random()
"""Jitter of retries and ticks, apart from the application's own ``random`` state."""

_LOGGER = logging.getLogger(__name__)
_RUNNING: str = Status.RUNNING.value  # read once: an enum member's value is a property
_MAX_ROUNDS = 20


class ClaimKind(str, Enum):
    """The answer to a claim."""

    CLAIMED = "claimed"
    """This delivery owns the job at a new epoch: run it."""
    COMPLETED = "completed"
    """The job is done: ack without running anything."""
    FAILED = "failed"
    """The job is in the failure path already: ack."""
    BUSY = "busy"
    """Another owner holds a live lease: do not run; try again in ``busy_for_s``."""
    CONFLICT = "conflict"
    """The key was used for another payload: this message goes to the failure path."""


@quick_init
@dataclass(frozen=True)
class ClaimRequest:
    """Who asks to claim which job."""

    identity: JobIdentity
    owner: str
    message_id: str
    delivery: str
    lease_s: float
    retention_s: float
    abandoned: Callable[[str, str], bool]
    """``abandoned(message_id, delivery)``: that delivery is this process's own, running past
    its processing cap (it stops at its next boundary); its live lease may be taken over."""
    trace_parent: str | None = None
    """The delivery's span context, stored with a new job so later deliveries link to it."""


@quick_init
@dataclass(frozen=True)
class Claim:
    """The outcome of :func:`claim`."""

    kind: ClaimKind
    record: JobRecord | None = None
    version: Version | None = None
    busy_for_s: float = 0.0
    """BUSY: seconds the owner's lease still runs, measured on the store's clock."""

    @property
    def epoch(self) -> int:
        """The fencing token of a successful claim."""
        assert self.record is not None
        return self.record.epoch


def decide(
    record: JobRecord,
    request: ClaimRequest,
    now: datetime,
    *,
    read_time: datetime | None = None,
    update_time: datetime | None = None,
) -> ClaimKind:
    """What the stored state allows this delivery to do. Pure: no I/O.

    ``read_time`` and ``update_time`` are the snapshot's server times; give
    them whenever the store has them (see :func:`lease_left_s`), so ``now``
    only matters for a store without server times. Order matters: a
    payload conflict is reported even for a completed job, so a second
    operation under a used key is never silently dropped.
    """
    if record.payload_sha256 not in (None, request.identity.payload_sha256):
        return ClaimKind.CONFLICT
    if record.status is Status.COMPLETED:
        return ClaimKind.COMPLETED
    if record.status is Status.FAILED:
        return ClaimKind.FAILED
    if record.status is Status.RUNNING:
        live = lease_left_s(record, now, read_time=read_time, update_time=update_time) > 0
        live = live and "live-lease" not in fences.OFF  # switched off in a test: taken over
        ours_abandoned = (
            record.owner == request.owner
            and record.message_id is not None
            and record.delivery is not None
            and record.delivery != request.delivery
            and request.abandoned(record.message_id, record.delivery)
        )
        if live and not ours_abandoned:
            return ClaimKind.BUSY
    return ClaimKind.CLAIMED


def _new_fields(request: ClaimRequest, now: datetime) -> dict[str, Any]:
    identity = request.identity
    return {
        s.KEY: display(identity.key),
        s.SUBSCRIPTION: identity.subscription,
        s.SHARD: s.shard_of(identity.doc_id),
        s.STATUS: _RUNNING,
        s.EPOCH: 1,
        s.OWNER: request.owner,
        s.MESSAGE_ID: request.message_id,
        s.DELIVERY: request.delivery,
        **lease_fields(request.lease_s, now),
        s.ATTEMPTS: 1,
        s.PAYLOAD_SHA256: identity.payload_sha256,
        s.FIRST_SEEN_AT: now,
        s.UPDATED_AT: now,
        s.EXPIRE_AT: now + timedelta(seconds=request.retention_s),
        **({s.TRACE_PARENT: request.trace_parent} if request.trace_parent else {}),
    }


def _new_record(fields: dict[str, Any]) -> JobRecord:
    """``JobRecord.parse(fields)`` of :func:`_new_fields`' fields, read without the general
    parse (a new job has no steps, outbox or failure fields): once per new job."""
    return JobRecord(
        status=Status.RUNNING,
        epoch=1,
        owner=fields[s.OWNER],
        message_id=fields[s.MESSAGE_ID],
        delivery=fields[s.DELIVERY],
        lease_expires_at=fields[s.LEASE_EXPIRES_AT],
        attempts=1,
        payload_sha256=fields[s.PAYLOAD_SHA256],
        lease_s=fields[s.LEASE_SECONDS],
        key=fields[s.KEY],
        subscription=fields[s.SUBSCRIPTION],
        trace_parent=fields.get(s.TRACE_PARENT),
    )


def claim(store: JobStore, request: ClaimRequest, *, exists_hint: bool = False) -> Claim:
    """Claim the job for this delivery, atomically.

    ``exists_hint`` skips the optimistic create when the caller knows the
    job was seen before (a redelivery). Raises
    :class:`~pubsub_worker.errors.StoreError` if the store keeps failing.
    """
    doc_id = request.identity.doc_id
    try_create = not exists_hint
    for _ in range(_MAX_ROUNDS):
        now = now_utc()
        if try_create:
            fields = _new_fields(request, now)
            try:
                version = store.create(doc_id, fields)
            except AlreadyExists:
                try_create = False
                if "claim" in fences.OFF:  # switched off in a test: write over the job found
                    version = store.update(doc_id, _changes(fields), expected=_now(store, doc_id))
                    return Claim(ClaimKind.CLAIMED, JobRecord.parse(fields), version)
            else:
                return Claim(ClaimKind.CLAIMED, _new_record(fields), version)
        snap = store.get(doc_id)
        if snap is None:
            try_create = True
            continue
        record = JobRecord.parse(snap.fields)
        if (
            record.status is Status.RUNNING
            and record.owner == request.owner
            and record.delivery == request.delivery
        ):
            # Our own claim, landed by an earlier round whose reply was lost.
            return Claim(ClaimKind.CLAIMED, record, snap.version)
        kind = decide(record, request, now, read_time=snap.read_time, update_time=snap.update_time)
        if kind is ClaimKind.BUSY:
            left_s = lease_left_s(
                record, now, read_time=snap.read_time, update_time=snap.update_time
            )
            return Claim(kind, record, snap.version, busy_for_s=max(left_s, 0.0))
        if kind is not ClaimKind.CLAIMED:
            return Claim(kind, record, snap.version)
        changes = _take_over(record, request, now)
        try:
            version = store.update(doc_id, changes, expected=snap.version)
        except VersionConflict:
            if "claim" not in fences.OFF:
                _LOGGER.debug("claim of %s raced another writer; deciding again", doc_id)
                time.sleep(_jitter.uniform(0.0, 0.02))
                continue
            # Switched off in a test: the take-over writes over whatever is there now.
            version = store.update(doc_id, changes, expected=_now(store, doc_id))
        taken = dataclasses.replace(
            record,
            status=Status.RUNNING,
            epoch=record.epoch + 1,
            owner=request.owner,
            message_id=request.message_id,
            delivery=request.delivery,
            lease_expires_at=now + timedelta(seconds=request.lease_s),
            attempts=record.attempts + 1,
            payload_sha256=request.identity.payload_sha256,
            lease_s=float(request.lease_s),
        )
        return Claim(ClaimKind.CLAIMED, taken, version)
    raise StoreError(f"claim of job {doc_id} did not settle after {_MAX_ROUNDS} rounds")


def _take_over(
    record: JobRecord, request: ClaimRequest, now: datetime
) -> dict[tuple[str, ...], Any]:
    """What a compare-and-set claim writes over ``record``."""
    changes: dict[tuple[str, ...], Any] = {
        (s.STATUS,): _RUNNING,
        (s.EPOCH,): record.epoch + 1,
        (s.OWNER,): request.owner,
        (s.MESSAGE_ID,): request.message_id,
        (s.DELIVERY,): request.delivery,
        **{(name,): value for name, value in lease_fields(request.lease_s, now).items()},
        (s.ATTEMPTS,): record.attempts + 1,
        (s.UPDATED_AT,): now,
        # Retention counts from the last claim, so a job still being retried is kept.
        (s.EXPIRE_AT,): now + timedelta(seconds=request.retention_s),
    }
    if record.payload_sha256 is None:
        changes[(s.PAYLOAD_SHA256,)] = request.identity.payload_sha256
    return changes


def _changes(fields: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    return {(name,): value for name, value in fields.items()}


def _now(store: JobStore, doc_id: str) -> Version:
    """The job's version now: what a claim writes over with the ``claim`` fence switched off."""
    snap = store.get(doc_id)
    if snap is None:
        raise StoreError(f"job {doc_id} vanished under a claim")
    return snap.version
