"""An in-memory job store for unit tests of pure logic; one process, no durability."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Mapping
from typing import Any

from pubsub_worker.store import AlreadyExists, Changes, Snapshot, Version, VersionConflict

__all__ = ["MemoryJobStore"]


class MemoryJobStore:
    """Implements :class:`~pubsub_worker.store.JobStore` with a dict and a lock.

    Versions are integers from one counter, so a version is never reused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _docs
        self._docs: dict[str, tuple[dict[str, Any], int]] = {}
        self._versions = itertools.count(1)
        self.writes = 0
        """Successful creates and updates, for tests that count store traffic."""

    def get(self, doc_id: str) -> Snapshot | None:
        with self._lock:
            found = self._docs.get(doc_id)
            if found is None:
                return None
            return Snapshot(fields=copy.deepcopy(found[0]), version=found[1])

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        with self._lock:
            if doc_id in self._docs:
                raise AlreadyExists(doc_id)
            version = next(self._versions)
            self._docs[doc_id] = (copy.deepcopy(dict(fields)), version)
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
            self._docs[doc_id] = (fields, version)
            self.writes += 1
            return version

    def delete_all(self) -> None:
        """Forget every document."""
        with self._lock:
            self._docs.clear()


def _set(fields: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    target = fields
    for name in path[:-1]:
        child = target.get(name)
        if not isinstance(child, dict):
            child = {}
            target[name] = child
        target = child
    target[path[-1]] = value
