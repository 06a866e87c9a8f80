"""The lease keeper: renews a message's Pub/Sub lease only while its job makes progress.

One named daemon thread per worker wakes about once a second. For each job
in flight it renews the ack deadline (``modify_ack_deadline_with_response``)
when half a lease has passed since the last renewal *and* the job reported
progress since then (a finished step or ``job.heartbeat()``). A stalled job
is therefore not renewed: Pub/Sub redelivers it after its lease and another
delivery recovers it. A renewal answered with ``INVALID_ACK_ID`` or
``FAILED_PRECONDITION`` marks the delivery lost; the job stops at its next
boundary. A job running longer than ``max_processing_s`` is abandoned: it
stops at its next boundary and is not renewed any more.

The Firestore lease is renewed by the job's own writes (every step commit
and heartbeat), never by this thread, so only the callback's thread writes
the job document.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from .metrics import Counter, Metrics

__all__ = ["LeaseKeeper", "Leased", "TrackedJob"]

_LOGGER = logging.getLogger(__name__)

LOST_STATUSES = (AcknowledgeStatus.INVALID_ACK_ID, AcknowledgeStatus.FAILED_PRECONDITION)


class Leased(Protocol):
    """The part of a Pub/Sub message the keeper uses."""

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]: ...


class TrackedJob(Protocol):
    """The part of a job the keeper reads (and the two events it may set)."""

    started: float
    last_progress: float
    abandoned: threading.Event

    @property
    def delivery(self) -> Any: ...

    @property
    def key(self) -> str: ...

    @property
    def message_id(self) -> str: ...


@dataclass
class _Entry:
    job: TrackedJob
    message: Leased
    publish_time: float
    last_renewal: float


class LeaseKeeper:
    """Renews leases of jobs that make progress; abandons jobs past the processing cap."""

    def __init__(
        self,
        *,
        lease_s: float,
        max_processing_s: float,
        metrics: Metrics,
        tick_s: float = 1.0,
    ) -> None:
        self._lease_s = lease_s
        self._max_processing_s = max_processing_s
        self._metrics = metrics
        self._tick_s = tick_s
        self._lock = threading.Lock()  # guards _entries and _thread
        self._entries: dict[int, _Entry] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the thread; idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="pubsub-worker-lease-keeper", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it; idempotent."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def track(self, job: TrackedJob, message: Leased, publish_time: float) -> None:
        """Keep ``message`` leased while ``job`` makes progress."""
        now = time.monotonic()
        with self._lock:
            self._entries[id(job)] = _Entry(job, message, publish_time, last_renewal=now)

    def untrack(self, job: TrackedJob) -> None:
        """Stop renewing; call when the callback ends, whatever the outcome."""
        with self._lock:
            self._entries.pop(id(job), None)

    def in_flight(self) -> int:
        """Jobs being processed now."""
        with self._lock:
            return len(self._entries)

    def oldest_age_s(self) -> float:
        """Age in seconds of the oldest message in flight (since it was published), or 0."""
        with self._lock:
            oldest = min((e.publish_time for e in self._entries.values()), default=None)
        return 0.0 if oldest is None else max(time.time() - oldest, 0.0)

    def tick(self) -> None:
        """One pass over the jobs in flight (the thread calls it; tests may too)."""
        now = time.monotonic()
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            job = entry.job
            if job.abandoned.is_set():
                continue
            if now - job.started > self._max_processing_s:
                job.abandoned.set()
                self._metrics.inc(Counter.ABANDONED)
                _LOGGER.warning(
                    "job %s message %s: abandoned after %.0f s (MAX_PROCESSING_SECONDS)",
                    job.key,
                    job.message_id,
                    now - job.started,
                )
                continue
            due = now - entry.last_renewal >= self._lease_s / 2
            if due and job.last_progress > entry.last_renewal:
                entry.last_renewal = now
                self._renew(entry)

    def _renew(self, entry: _Entry) -> None:
        job = entry.job
        try:
            future = entry.message.modify_ack_deadline_with_response(int(self._lease_s))
        except Exception:
            self._metrics.inc(Counter.RENEWAL_FAILURES)
            _LOGGER.exception("job %s message %s: lease renewal failed", job.key, job.message_id)
            return

        def done(f: Future[Any]) -> None:
            error = f.exception()
            if error is None:
                self._metrics.inc(Counter.RENEWALS)
                return
            self._metrics.inc(Counter.RENEWAL_FAILURES)
            if isinstance(error, AcknowledgeError) and error.error_code in LOST_STATUSES:
                job.delivery.lost.set()
                _LOGGER.warning(
                    "job %s message %s: lease renewal refused (%s); ownership lost",
                    job.key,
                    job.message_id,
                    error.error_code.name,
                )
            else:
                _LOGGER.warning(
                    "job %s message %s: lease renewal failed: %s", job.key, job.message_id, error
                )

        future.add_done_callback(done)

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s * random.uniform(0.8, 1.2)):
            try:
                self.tick()
            except Exception:  # the keeper must outlive any one bad job
                _LOGGER.exception("lease keeper pass failed")
