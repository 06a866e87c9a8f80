"""Job store implementations: Firestore for real work, memory for unit tests."""

from __future__ import annotations

from .firestore import FirestoreJobStore
from .memory import MemoryJobStore

__all__ = ["FirestoreJobStore", "MemoryJobStore"]
