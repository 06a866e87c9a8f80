"""pubsub-worker: exactly-once processing for Google Cloud Pub/Sub subscribers.

::

    import pubsub_worker

    @pubsub_worker.exactly_once
    def handle(message, job):
        url = job.step("upload", lambda: upload(message.data))
        job.step("notify", lambda: notify(url))

    pubsub_worker.run(handle)
"""

from __future__ import annotations

from .errors import (
    ConfigError,
    InvalidMessage,
    LostOwnership,
    PermanentError,
    ProcessingTimeout,
    PubSubWorkerError,
    ShuttingDown,
    StoreError,
    Unreachable,
)
from .job import Job
from .metrics import Counter, Metrics
from .runner import flow_control, run
from .settings import Settings
from .store import JobStore, Status
from .stores import BatchingFirestoreJobStore, FirestoreJobStore, MemoryJobStore
from .wrapper import ExactlyOnce, exactly_once

__all__ = [
    "BatchingFirestoreJobStore",
    "ConfigError",
    "Counter",
    "ExactlyOnce",
    "FirestoreJobStore",
    "InvalidMessage",
    "Job",
    "JobStore",
    "LostOwnership",
    "MemoryJobStore",
    "Metrics",
    "PermanentError",
    "ProcessingTimeout",
    "PubSubWorkerError",
    "Settings",
    "ShuttingDown",
    "Status",
    "StoreError",
    "Unreachable",
    "exactly_once",
    "flow_control",
    "run",
]

__version__ = "0.1.0"
