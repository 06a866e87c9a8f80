"""Job stores: Firestore (batched by default) for real work, memory for unit tests."""

from __future__ import annotations

from .batching import BatchingFirestoreJobStore
from .firestore import FirestoreJobStore
from .memory import MemoryJobStore

__all__ = ["BatchingFirestoreJobStore", "FirestoreJobStore", "MemoryJobStore"]
