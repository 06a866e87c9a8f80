"""Fenced writes of one job document, and the Firestore lease they carry.

:class:`FencedDocument` is the owner's handle on its job document. Every
write is an update conditioned on the version our previous write returned
(:mod:`pubsub_worker.stores.base`): any other writer, a new owner's claim or a
replay included, moves the version, so a stale owner's write fails. A write
that conflicts is settled by reading the document: still ours (same epoch,
delivery, running) means our own earlier write landed without its reply,
and the write is sent again on the new version; anything else is
:class:`~pubsub_worker.errors.LostOwnership`.

**The Firestore lease.** The claim stores ``lease_seconds``; every fenced
write renews the lease because it moves the document's update time, and a
job is live while ``update_time + lease_seconds`` is ahead of the reader's
server read time (:mod:`pubsub_worker._job.lease`). ``lease_expires_at`` is
written too, from this worker's clock, for humans only. The lease is
renewed by step commits and by heartbeats, at most every third of a lease.

Records are staged (``stage``) and committed with the next write, so a
step's record can ride along with the next step's commit or the completion.
"""

from __future__ import annotations

import time
from _thread import RLock  # threading.RLock's C lock, without its Python call
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from pubsub_worker._support import fences
from pubsub_worker._support.unsuspended import run_unsuspended
from pubsub_worker.errors import LostOwnership, PermanentError, VersionConflict
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, JobStore, Status, Version
from pubsub_worker.stores.continued import ContinuedStore, Settle, continues
from pubsub_worker.stores.transactions import AsyncTransactionalStore, TransactionalStore

from . import endings
from .lease import now_utc, renewal_due

__all__ = ["FencedDocument", "Finish", "Then", "raising"]

T = TypeVar("T")

Finish = Callable[[], None]
"""Goes on with a write whose first attempt failed, as the write would have (may wait)."""
Then = Callable[[Finish | None], None]
"""Told how a write not waited for went: ``None`` once applied, else a :data:`Finish`."""

_WRITE_ROUNDS = 3


def raising(error: Exception) -> Finish:
    """A :data:`Finish` for a write that failed for good before or at its first attempt."""

    def failed() -> None:
        raise error

    return failed


class FencedDocument:
    """The owner's conditional writes to one job document. Thread-safe."""

    def __init__(
        self,
        *,
        store: JobStore,
        doc_id: str,
        epoch: int,
        delivery: str,
        version: Version,
        lease_s: float,
        on_lost: Callable[[str], LostOwnership],
        on_rejected: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._doc_id = doc_id
        self._epoch = epoch
        self._delivery = delivery
        self._lease_s = lease_s
        self._on_lost = on_lost
        self._on_rejected = on_rejected
        self._lock = RLock()  # guards _version, _pending, _last_write
        self._version: Version | None = version
        self._pending: dict[tuple[str, ...], Any] = {}
        self._last_write = time.monotonic()

    def stage(self, changes: Mapping[tuple[str, ...], Any]) -> None:
        """Keep ``changes`` for the next write."""
        with self._lock:
            self._pending.update(changes)

    def unstage(self, prefix: tuple[str, ...]) -> None:
        """Forget staged changes under ``prefix`` (a record that cannot be written)."""
        with self._lock:
            for path in [p for p in self._pending if p[: len(prefix)] == prefix]:
                del self._pending[path]

    @contextmanager
    def unless_busy(self) -> Iterator[bool]:
        """Hold the document for the block if no write is under way (True); never waits.

        False while another thread writes (a lease renewal): what would stage
        or read under the block would wait for that write's RPC. An async step
        stages its record on the event loop only when this is True, and hands
        it to a thread otherwise, so the loop never waits for Firestore.
        """
        free = self._lock.acquire(blocking=False)
        try:
            yield free
        finally:
            if free:
                self._lock.release()

    def staged(self, prefix: tuple[str, ...]) -> bool:
        """Whether a change under ``prefix`` waits for the next write."""
        if not self._pending:  # most reads: nothing staged (one read of a dict, atomic)
            return False
        with self._lock:
            return any(path[: len(prefix)] == prefix for path in self._pending)

    @property
    def version(self) -> Version | None:
        """The version our last write returned; None while a refused write is being settled."""
        with self._lock:
            return self._version

    @property
    def written_at(self) -> float:
        """``time.monotonic()`` of our last write (the claim's, at first): the lease's renewal."""
        return self._last_write

    def lease_due(self, now: float | None = None) -> bool:
        """A write would renew the lease ``now`` (monotonic; read here if None): renewal_due."""
        return renewal_due(self._last_write, self._lease_s, now)

    def lease_changes(self, now: datetime | None = None) -> dict[tuple[str, ...], Any]:
        """The human-readable lease and ``updated_at`` (the update time is the real lease)."""
        now = now_utc() if now is None else now
        return {
            (s.LEASE_EXPIRES_AT,): now + timedelta(seconds=self._lease_s),
            (s.UPDATED_AT,): now,
        }

    def write(
        self, changes: Mapping[tuple[str, ...], Any] | None = None, *, now: datetime | None = None
    ) -> None:
        """Commit staged records plus ``changes``, conditioned on our last version (``now``:
        the time the lease is counted from, when the caller read it already).

        Raises :class:`LostOwnership` when another writer owns the document
        now, :class:`~pubsub_worker.errors.StoreError` when the store fails.
        The precondition is the ``commit`` fence (:mod:`pubsub_worker._support.fences`).
        """
        with self._lock:
            self._write_rounds(self._merged(changes, now), None)

    def write_then(
        self, changes: Mapping[tuple[str, ...], Any], *, now: datetime, then: Then
    ) -> None:
        """:meth:`write`, without waiting on a store that can say when it is done.

        ``then(None)`` once the write applied, on the thread that sent it or a
        store's writer (it must not block); ``then(finish)`` when it did not, or its outcome is
        unknown: ``finish()`` goes on as :meth:`write` would from that first
        attempt (settling it, reading the document after a conflict, writing
        again) and raises what :meth:`write` raises; call it on a thread that
        may wait. Only for the owner's last write (nothing stages meanwhile,
        no renewal runs): a store that cannot tell (``update_then``) writes
        here, then calls ``then``.
        """
        store = self._store
        with self._lock:
            merged = self._merged(changes, now)
            expected = self._version
        if expected is None or not continues(store):
            try:  # a refused write being settled, or a store that cannot tell: written here
                with self._lock:
                    self._write_rounds(merged, None)
            except Exception as exc:  # noqa: BLE001 - handed on, as a write not waited for
                then(raising(exc))
                return
            then(None)
            return

        def done(version: Version | None, settle: Settle | None) -> None:
            if settle is None:
                self._committed(version)
                then(None)
                return

            def finish() -> None:
                with self._lock:
                    self._write_rounds(merged, settle)

            then(finish)

        cast(ContinuedStore, store).update_then(self._doc_id, merged, expected=expected, then=done)

    def _merged(
        self, changes: Mapping[tuple[str, ...], Any] | None, now: datetime | None
    ) -> dict[tuple[str, ...], Any]:
        merged = dict(self._pending)
        merged.update(self.lease_changes(now))
        merged.update(changes or {})
        return merged

    def _write_rounds(self, merged: dict[tuple[str, ...], Any], first: Settle | None) -> None:
        """Write ``merged`` on our version (``first``: the outcome of an attempt already made)."""
        for _ in range(_WRITE_ROUNDS):
            expected = self._version if self._version is not None else self.resettle()
            try:
                if first is not None:
                    version, first = first(), None
                else:
                    version = self._store.update(self._doc_id, merged, expected=expected)
            except VersionConflict:
                self._version = None  # settle by reading: still ours, or lost
                if "commit" in fences.OFF:  # switched off in a test: write over what is there
                    self._version = self._version_now()
                continue
            self._committed(version)
            return
        raise self._on_lost("the job document kept changing under this owner")

    def complete(self, *, retention_s: float, then: Then | None = None) -> None:
        """The completion: status ``completed``, kept ``retention_s`` for a TTL policy.

        With ``then``: not waited for where the store can tell (:meth:`write_then`).
        """
        now = now_utc()
        if then is None:
            self.write(endings.completed(now, retention_s), now=now)
        else:
            self.write_then(endings.completed(now, retention_s), now=now, then=then)

    def release(self, *, error: str | None, attempts: int) -> None:
        """Give the job back (status ``released``) with ``attempts`` claims counted."""
        self.write(endings.released(now_utc(), error, attempts))

    def fail(
        self, *, reason: str, error: str, extra: Mapping[str, Any], retention_s: float
    ) -> None:
        """The failed record of the failure path, with ``extra`` fields (the original message)."""
        self.write(
            endings.failed(
                now_utc(), reason=reason, error=error, extra=extra, retention_s=retention_s
            )
        )

    def transact(
        self,
        body: Callable[[Any], T],
        changes: Callable[[Any], Mapping[tuple[str, ...], Any]],
        adopt: Callable[[JobRecord], bool],
    ) -> tuple[T | None, JobRecord | None]:
        """Run ``body`` in a transaction that also writes staged records plus ``changes(result)``.

        Returns ``(result, None)`` when the transaction committed. When it
        conflicted and a fresh read shows the commit landed anyway (a lost
        reply: ``adopt(record)`` is true), returns ``(None, record)``. Raises
        :class:`LostOwnership` when another owner wrote.
        """
        store = self._store
        if not isinstance(store, TransactionalStore):
            raise PermanentError(  # no retry can change that: to review, replayed once it can
                f"the job store ({type(store).__name__}) cannot run transactional steps: "
                "it has no transact()"
            )
        all_changes = self._with_staged(changes)

        async def attempt(expected: Version) -> tuple[T, Version]:
            return store.transact(self._doc_id, expected=expected, body=body, changes=all_changes)

        with self._lock:
            return run_unsuspended(self._transact(attempt, adopt))

    async def transact_async(
        self,
        body: Callable[[Any], Awaitable[T]],
        changes: Callable[[Any], Mapping[tuple[str, ...], Any]],
        adopt: Callable[[JobRecord], bool],
    ) -> tuple[T | None, JobRecord | None]:
        """:meth:`transact` for an ``async def`` body, awaited through the store's own
        (:class:`~pubsub_worker.stores.transactions.AsyncTransactionalStore`).

        Only the handler's task uses the document meanwhile, so no lock is
        held across the awaits; the rare conflict is settled with a
        (blocking) read, as in :meth:`transact`.
        """
        store = self._store
        if not isinstance(store, AsyncTransactionalStore):
            raise PermanentError(
                f"the job store ({type(store).__name__}) cannot run an async def handler's "
                "transactional steps: it has no transact_async()"
            )
        all_changes = self._with_staged(changes)

        async def attempt(expected: Version) -> tuple[T, Version]:
            return await store.transact_async(
                self._doc_id, expected=expected, body=body, changes=all_changes
            )

        return await self._transact(attempt, adopt)

    async def _transact(
        self,
        attempt: Callable[[Version], Awaitable[tuple[T, Version]]],
        adopt: Callable[[JobRecord], bool],
    ) -> tuple[T | None, JobRecord | None]:
        """The rounds of :meth:`transact` and :meth:`transact_async`: ``attempt`` commits once.

        A conflict is settled by reading: our own commit whose reply was lost
        is adopted, a new owner is :class:`LostOwnership`, anything else
        (our own earlier write moved the version) is tried again.
        """
        for _ in range(_WRITE_ROUNDS):
            expected = self._version if self._version is not None else self.resettle()
            try:
                result, version = await attempt(expected)
            except VersionConflict:
                if (record := self._adopted(adopt)) is not None:
                    return None, record
                continue
            self._committed(version)
            return result, None
        raise self._on_lost("the transactional step kept conflicting with another writer")

    def _with_staged(
        self, changes: Callable[[Any], Mapping[tuple[str, ...], Any]]
    ) -> Callable[[Any], dict[tuple[str, ...], Any]]:
        """``changes(result)`` plus the staged records and the lease, for a transaction."""

        def all_changes(result: Any) -> dict[tuple[str, ...], Any]:
            with self._lock:
                merged = dict(self._pending)
            merged.update(changes(result))
            merged.update(self.lease_changes())
            return merged

        return all_changes

    def _adopted(self, adopt: Callable[[JobRecord], bool]) -> JobRecord | None:
        """After a conflict: a new owner (LostOwnership), or our commit whose reply was lost."""
        record, version = self.read_own()
        with self._lock:
            self._version = version
        if adopt(record):
            self._committed(version)
            return record
        return None

    def _committed(self, version: Version | None) -> None:
        with self._lock:
            self._version = version
            self._pending.clear()
            self._last_write = time.monotonic()

    def resettle(self) -> Version:
        """Read the job: if it is still ours, its version; else :class:`LostOwnership`.

        Called after a conditional write was refused: a refusal by another
        owner is a rejected stale commit (counted by ``on_rejected``).
        """
        try:
            return self.read_own()[1]
        except LostOwnership:
            self._on_rejected()
            raise

    def _version_now(self) -> Version | None:
        """The document's version now, whoever wrote it (the ``commit`` fence switched off)."""
        snap = self._store.get(self._doc_id)
        return snap.version if snap is not None else None

    def read_own(self) -> tuple[JobRecord, Version]:
        """The job as read, with its version, if it is still ours; else :class:`LostOwnership`."""
        snap = self._store.get(self._doc_id)
        if snap is None:
            raise self._on_lost("the job document is gone")
        record = JobRecord.parse(snap.fields)
        if (
            record.epoch != self._epoch
            or record.status is not Status.RUNNING
            or record.delivery != self._delivery
        ):
            raise self._on_lost(
                f"the job was claimed at epoch {record.epoch} (ours: {self._epoch})"
            )
        return record, snap.version
