"""What every ``pubsub-worker`` command takes from the environment: its settings and job store."""

from __future__ import annotations

from pubsub_worker._support import clients
from pubsub_worker.settings import Settings
from pubsub_worker.stores import FirestoreJobStore

__all__ = ["job_store", "settings_from_env"]


def settings_from_env() -> Settings:
    """Settings from the environment; :meth:`Settings.from_env` applies Cloud Run's grace."""
    return Settings.from_env()


def job_store(settings: Settings) -> FirestoreJobStore:
    """The job store the commands read and write (one write at a time: no batching needed)."""
    return FirestoreJobStore(clients.firestore_client(settings), settings.collection)
