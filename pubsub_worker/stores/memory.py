"""An in-memory job store for unit tests of pure logic; one process, no durability.

It keeps the whole store contract, transactions included, an ``async def``
handler's too (:class:`~pubsub_worker.stores.transactions.AsyncTransactionalStore`),
so the claim, the fences and ``job.transactional_step`` run on it as on Firestore. A
transaction's function gets a :class:`MemoryTransaction` where Firestore's
gets a ``google.cloud.firestore.Transaction``: reads of the store's
documents, and writes kept until the commit.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from pubsub_worker._support import fences
from pubsub_worker._support.unsuspended import run_unsuspended
from pubsub_worker.errors import StoreError

from .base import AlreadyExists, Changes, Snapshot, Version, VersionConflict

__all__ = ["MemoryJobStore", "MemoryTransaction"]

_TICK = timedelta(microseconds=1)
_MAX_ATTEMPTS = 5
"""Runs of a transaction's function whose reads went stale before it gives up (Firestore's)."""


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


_IMMUTABLE = (str, bytes, int, float, bool, type(None), datetime)
"""Values a stored document holds that no caller can change in place: shared, not copied."""


_SHARED = frozenset(_IMMUTABLE)
"""The exact types of :data:`_IMMUTABLE`: most of a document's values, shared without a call."""


def _copy(value: Any) -> Any:
    """A deep copy of a stored value: maps and lists copied, immutable values shared.

    What ``copy.deepcopy`` would give for a document's values, at a fraction of
    its cost (it was most of this store's CPU per write); other types fall
    back to it. A map's or list's items of an exact immutable type are shared
    without a call of their own (a job's record is mostly strings and numbers).
    """
    if type(value) in _SHARED:
        return value
    if isinstance(value, dict):
        return {
            name: item if type(item) in _SHARED else _copy(item) for name, item in value.items()
        }
    if isinstance(value, list):
        return [item if type(item) in _SHARED else _copy(item) for item in value]
    if isinstance(value, _IMMUTABLE):  # a subclass of one
        return value
    return copy.deepcopy(value)


class MemoryJobStore:
    """Implements :class:`~pubsub_worker.stores.transactions.AsyncTransactionalStore` with a dict
    and a lock.

    Versions are integers from one counter, so a version is never reused.
    ``clock`` plays the server's clock: it stamps each write's update time
    and each read's read time (one process, one clock), and a test can pass
    one it moves by hand. Update times strictly increase, as Firestore's do,
    even if the clock stands still.
    """

    def __init__(self, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # guards _docs and _last_write
        self._docs: dict[str, tuple[dict[str, Any], int, datetime]] = {}
        self._versions = itertools.count(1)
        self._last_write: datetime | None = None
        self.writes = 0
        """Documents created or changed (a transaction counts each it wrote), for tests that
        count store traffic."""

    def get(self, doc_id: str) -> Snapshot | None:
        with self._lock:
            found = self._docs.get(doc_id)
            if found is None:
                return None
            fields, version, update_time = found
            return Snapshot(
                fields=_copy(fields),
                version=version,
                read_time=max(self._clock(), update_time),
                update_time=update_time,
            )

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        copied: dict[str, Any] = _copy(dict(fields))  # outside the lock: callers queue on it
        with self._lock:
            if doc_id in self._docs:
                raise AlreadyExists(doc_id)
            return self._put(doc_id, copied)

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        values = {
            path: value if type(value) in _SHARED else _copy(value)
            for path, value in changes.items()
        }
        with self._lock:
            self._check(doc_id, expected)
            return self._put(doc_id, _changed(self._docs[doc_id][0], values))

    def transact(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Any],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """Run ``body(transaction)``, then write ``changes(result)`` to the job; all or nothing.

        As :meth:`~pubsub_worker.stores.firestore.FirestoreJobStore.transact`:
        :class:`VersionConflict` unless the job is at ``expected``, checked
        before ``body`` runs and again at the commit; an exception from
        ``body`` or ``changes`` writes nothing and is raised as it is.
        ``body`` gets a :class:`MemoryTransaction` and runs without the
        store's lock (it may read through the store); it is run again when a
        document it read changed before the commit (Firestore retries such a
        transaction too), at most 5 times, then :class:`StoreError`. Returns
        the body's result and the job's new version.
        """

        async def called(transaction: MemoryTransaction) -> Any:
            return body(transaction)

        return run_unsuspended(self._transact(doc_id, expected, called, changes))

    async def transact_async(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Awaitable[Any]],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """:meth:`transact` with ``await body(transaction)`` (an ``async def`` handler's step):
        the same rounds, the body awaited without the store's lock."""
        return await self._transact(doc_id, expected, body, changes)

    async def _transact(
        self,
        doc_id: str,
        expected: Version,
        body: Callable[[MemoryTransaction], Awaitable[Any]],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """The rounds of :meth:`transact` and :meth:`transact_async`."""
        # The transaction's version check; switched off in a test (``fences``), a
        # transaction writes over whatever version the job is at.
        check = self._check if "transaction" not in fences.OFF else self._check_exists
        for _ in range(_MAX_ATTEMPTS):
            with self._lock:
                check(doc_id, expected)
            transaction = MemoryTransaction(self)
            result = await body(transaction)
            job_changes = {path: _copy(value) for path, value in changes(result).items()}
            with self._lock:
                check(doc_id, expected)
                if any(self._version(d) != v for d, v in transaction.reads.items()):
                    continue  # contention: run the body again on fresh reads
                writes = [*transaction.writes, ("update", doc_id, job_changes)]
                return result, self._commit(writes)[doc_id]
        raise StoreError(f"the transaction on job {doc_id} kept conflicting")

    def snapshots(self) -> dict[str, Snapshot]:
        """Every document, by id, as one read now would find it (copies).

        A store has no queries; this is how tools and tests that look at the
        whole store (``jobs stats`` on memory, :mod:`pubsub_worker._ops.stats`)
        read it.
        """
        with self._lock:
            now = self._clock()
            return {
                doc_id: Snapshot(
                    fields=_copy(fields),
                    version=version,
                    read_time=max(now, update_time),
                    update_time=update_time,
                )
                for doc_id, (fields, version, update_time) in self._docs.items()
            }

    def delete_all(self) -> None:
        """Forget every document."""
        with self._lock:
            self._docs.clear()

    def _version(self, doc_id: str) -> int | None:
        found = self._docs.get(doc_id)
        return found[1] if found is not None else None

    def _check(self, doc_id: str, expected: Version) -> None:
        """:class:`VersionConflict` unless the job is at ``expected``; the caller holds the lock."""
        version = self._version(doc_id)
        if version is None or version != expected:
            raise VersionConflict(doc_id)

    def _check_exists(self, doc_id: str, expected: Version) -> None:
        """:class:`VersionConflict` only if the job is gone (the fence switched off)."""
        if self._version(doc_id) is None:
            raise VersionConflict(doc_id)

    def _commit(self, writes: list[tuple[str, str, Any]]) -> dict[str, int]:
        """Apply a transaction's writes in order, all or nothing; the caller holds the lock.

        Every document's new state is worked out before any is stored.
        Returns the new version of each document written.
        """
        state: dict[str, dict[str, Any] | None] = {}
        for kind, doc_id, payload in writes:
            if doc_id not in state:
                found = self._docs.get(doc_id)
                state[doc_id] = found[0] if found is not None else None
            fields = state[doc_id]
            if kind == "create" and fields is not None:
                raise StoreError(f"the transaction's create of {doc_id} found it existing")
            if kind == "update" and fields is None:
                raise StoreError(f"the transaction's update of {doc_id} found no document")
            # The new fields; None for a delete.
            state[doc_id] = (
                _changed(fields, payload) if fields is not None and kind == "update" else payload
            )
        versions: dict[str, int] = {}
        for doc_id, new in state.items():
            if new is None:
                self._docs.pop(doc_id, None)
            else:
                versions[doc_id] = self._put(doc_id, new)
        return versions

    def _put(self, doc_id: str, fields: dict[str, Any]) -> int:
        """Store ``fields`` as the document's new state; the caller holds the lock."""
        version = next(self._versions)
        self._docs[doc_id] = (fields, version, self._write_time())
        self.writes += 1
        return version

    def _write_time(self) -> datetime:
        """The update time of a write now; the caller holds the lock."""
        stamp = self._clock()
        if self._last_write is not None and stamp <= self._last_write:
            stamp = self._last_write + _TICK
        self._last_write = stamp
        return stamp


class MemoryTransaction:
    """What a transactional step's function gets on :class:`MemoryJobStore`.

    Reads see the documents as committed; writes are kept and applied at the
    commit, together with the job's record, or not at all. As in a Firestore
    transaction, every read comes before the first write. A ``create`` of a
    document that exists, or an ``update`` of one that does not, fails the
    whole commit with :class:`StoreError` (Firestore's commit fails too).
    """

    def __init__(self, store: MemoryJobStore) -> None:
        self._store = store
        self.reads: dict[str, object] = {}
        """Each document read, with the version read (``None``: it did not exist)."""
        self.writes: list[tuple[str, str, Any]] = []
        """The writes the commit applies, in order: (create | set | update | delete, doc id,
        fields or changes)."""

    def get(self, doc_id: str) -> dict[str, Any] | None:
        """The document's fields (a copy), or ``None`` when it does not exist."""
        if self.writes:
            raise RuntimeError("a transaction reads every document before it writes one")
        snap = self._store.get(doc_id)
        self.reads[doc_id] = snap.version if snap is not None else None
        return snap.fields if snap is not None else None

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> None:
        """Create the document at the commit; the commit fails if it exists by then."""
        self.writes.append(("create", doc_id, _copy(dict(fields))))

    def set(self, doc_id: str, fields: Mapping[str, Any]) -> None:
        """Replace (or create) the document at the commit."""
        self.writes.append(("set", doc_id, _copy(dict(fields))))

    def update(self, doc_id: str, changes: Changes) -> None:
        """Change fields (paths as in :meth:`MemoryJobStore.update`) at the commit."""
        self.writes.append(("update", doc_id, _copy(dict(changes))))

    def delete(self, doc_id: str) -> None:
        """Delete the document at the commit."""
        self.writes.append(("delete", doc_id, None))


def _changed(fields: dict[str, Any], changes: Changes) -> dict[str, Any]:
    """A copy of ``fields`` with ``changes`` applied; ``fields`` is left as it was.

    Only the maps along each changed path are copied: the rest is shared with
    ``fields``, which is safe because a stored document is never changed in
    place (:meth:`MemoryJobStore.get` hands out deep copies). A whole-document
    deep copy per write was most of this store's cost. The new values are
    stored as given: the caller copies them first, outside the store's lock.
    """
    result = dict(fields)
    fresh: set[int] = {id(result)}  # maps copied for this change, safe to write into
    for path, value in changes.items():
        target = result
        for name in path[:-1]:
            child = target.get(name)
            if not isinstance(child, dict):
                child = {}
            elif id(child) not in fresh:
                child = dict(child)
            fresh.add(id(child))
            target[name] = child
            target = child
        target[path[-1]] = value
    return result
