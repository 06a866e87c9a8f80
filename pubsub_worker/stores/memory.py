"""An in-memory job store for unit tests of pure logic; one process, no durability."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from .base import AlreadyExists, Changes, Snapshot, Version, VersionConflict

__all__ = ["MemoryJobStore"]

_TICK = timedelta(microseconds=1)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryJobStore:
    """Implements :class:`~pubsub_worker.stores.base.JobStore` with a dict and a lock.

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
        """Successful creates and updates, for tests that count store traffic."""

    def get(self, doc_id: str) -> Snapshot | None:
        with self._lock:
            found = self._docs.get(doc_id)
            if found is None:
                return None
            fields, version, update_time = found
            return Snapshot(
                fields=copy.deepcopy(fields),
                version=version,
                read_time=max(self._clock(), update_time),
                update_time=update_time,
            )

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        with self._lock:
            if doc_id in self._docs:
                raise AlreadyExists(doc_id)
            version = next(self._versions)
            self._docs[doc_id] = (copy.deepcopy(dict(fields)), version, self._write_time())
            self.writes += 1
            return version

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        with self._lock:
            found = self._docs.get(doc_id)
            if found is None or found[1] != expected:
                raise VersionConflict(doc_id)
            fields = copy.deepcopy(found[0])
            for path, value in changes.items():
                _set(fields, path, copy.deepcopy(value))
            version = next(self._versions)
            self._docs[doc_id] = (fields, version, self._write_time())
            self.writes += 1
            return version

    def delete_all(self) -> None:
        """Forget every document."""
        with self._lock:
            self._docs.clear()

    def _write_time(self) -> datetime:
        """The update time of a write now; the caller holds the lock."""
        stamp = self._clock()
        if self._last_write is not None and stamp <= self._last_write:
            stamp = self._last_write + _TICK
        self._last_write = stamp
        return stamp


def _set(fields: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    target = fields
    for name in path[:-1]:
        child = target.get(name)
        if not isinstance(child, dict):
            child = {}
            target[name] = child
        target = child
    target[path[-1]] = value
