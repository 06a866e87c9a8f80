"""What a job needs from the worker that runs it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from pubsub_worker._delivery.generations import DeliveryTracker
from pubsub_worker._support.clients import Publish
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores.base import JobStore

__all__ = ["JobContext", "Publish"]


@dataclass(frozen=True)
class JobContext:
    """What a job needs from the worker that runs it."""

    store: JobStore
    tracker: DeliveryTracker
    metrics: Metrics
    publish: Publish
    topic_path: Callable[[str], str]
    lease_s: float
    retention_s: float
    io_timeout_s: float
    outbox_key_attribute: str
    stopping: threading.Event
    """Set when in-flight jobs must stop at their next boundary (shutdown grace is over)."""
    hooks: Hooks
