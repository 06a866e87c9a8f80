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

from pubsub_worker._job.async_job import AsyncJob
from pubsub_worker._job.job import Job
from pubsub_worker._support import distribution as _distribution
from pubsub_worker._support.metrics import Counter, Metrics
from pubsub_worker._worker.outcome import Outcome
from pubsub_worker._worker.runner import flow_control, run
from pubsub_worker._worker.wrapper import ExactlyOnce, exactly_once
from pubsub_worker.stores.base import JobStore, Status

from .errors import (
    AlreadyExists,
    ConfigError,
    DocumentTooLarge,
    FailurePathUnavailable,
    InvalidMessage,
    LimitExceeded,
    LostOwnership,
    OutboxUnsent,
    PermanentError,
    ProcessingTimeout,
    PubSubWorkerError,
    ShuttingDown,
    StoreError,
    Unreachable,
    VersionConflict,
)
from .hooks import Hooks
from .settings import Settings
from .stores import BatchingFirestoreJobStore, FirestoreJobStore, MemoryJobStore

__all__ = [
    "AlreadyExists",
    "AsyncJob",
    "BatchingFirestoreJobStore",
    "ConfigError",
    "Counter",
    "DocumentTooLarge",
    "ExactlyOnce",
    "FailurePathUnavailable",
    "FirestoreJobStore",
    "Hooks",
    "InvalidMessage",
    "Job",
    "JobStore",
    "LimitExceeded",
    "LostOwnership",
    "MemoryJobStore",
    "Metrics",
    "OutboxUnsent",
    "Outcome",
    "PermanentError",
    "ProcessingTimeout",
    "PubSubWorkerError",
    "Settings",
    "ShuttingDown",
    "Status",
    "StoreError",
    "Unreachable",
    "VersionConflict",
    "exactly_once",
    "flow_control",
    "run",
]


__version__: str = _distribution.installed_version()
"""The version of the installed distribution, as in ``pip show pubsub-exactly-once``."""
