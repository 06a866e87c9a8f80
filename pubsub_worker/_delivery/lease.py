"""The Pub/Sub lease of every message in the worker's hands, from receipt to settlement.

A message is watched from the moment the worker receives it (the scheduler
of :func:`pubsub_worker.run` reports the receipt; a plain
``subscriber.subscribe`` reports it when the callback starts). Time spent
waiting for a thread, for the key gate or for a busy owner counts: the
processing cap (``max_processing_s``) runs from receipt.

One named daemon thread wakes about once a second and, for each message:

* **waiting** (no job claimed yet): renews the ack deadline every half lease;
  waiting is the worker's doing, not a stall;
* **running** (a job claimed): renews every half lease *only if the job
  reported progress* since the last renewal (a finished step or
  ``job.heartbeat()``). A job with no progress for a whole lease is *stalled*:
  the delivery is given up (dropped from the client's lease management, so
  Pub/Sub redelivers it within a lease) and the job stops at its next
  boundary;
* **held** (an existing ``callback(message)`` returned without acking or
  nacking: the message is in the user's own threads): renewed every half
  lease, as the stock client keeps a message it holds, until it is acked or
  nacked;
* past the cap: the job is abandoned (it stops at its next boundary with
  ``ProcessingTimeout``) and the message is not renewed any more; a held one
  is concluded at once as a failed attempt (the ticket's ``expire``).

After each pass it releases what flow control allows of the messages a stock
client holds with its stream running, which the client itself would leave
until its next pull response (:mod:`.on_hold`).

The two leases go together: while a job progresses (or is held), the keeper
also has its Firestore lease renewed (``job.keep_alive()``, on a small pool of
its own so that a slow write never delays a Pub/Sub renewal), whether or not
the job had a record to write.

A renewal answered ``INVALID_ACK_ID`` or ``FAILED_PRECONDITION`` marks the
delivery lost. The client's own lease management (flow control's
``max_lease_duration``, set by :func:`pubsub_worker.flow_control` to the cap
plus a lease) holds the flow-control slot of a message until it is settled,
so no more than ``MAX_MESSAGES + PREFETCH_MESSAGES`` callbacks run or queue
at once (:func:`pubsub_worker.run`).

The Firestore lease is renewed by the job's own writes
(:mod:`pubsub_worker._job.fencing`), never by this thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from pubsub_worker._support.logs import JobLogger, job_logger
from pubsub_worker._support.metrics import Counter, Metrics

from .generations import Delivery
from .on_hold import OnHold

__all__ = ["LOST_STATUSES", "LeaseKeeper", "Leased", "Ticket", "TrackedJob"]

_jitter = random.Random()
"""Jitter of retries and ticks, apart from the application's own ``random`` state."""

_LOGGER = logging.getLogger(__name__)

LOST_STATUSES = (AcknowledgeStatus.INVALID_ACK_ID, AcknowledgeStatus.FAILED_PRECONDITION)
"""Ack and modack answers that mean this delivery no longer owns the message."""


class Leased(Protocol):
    """The part of a Pub/Sub message the keeper uses."""

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]: ...

    def drop(self) -> None: ...


class TrackedJob(Protocol):
    """The part of a job the keeper reads (and the flag it may set)."""

    last_progress: float
    abandoned: bool
    held: bool

    @property
    def settling(self) -> bool: ...

    @property
    def unsent_count(self) -> int: ...

    @property
    def store_lease_due(self) -> bool: ...

    def keep_alive(self) -> None: ...


@dataclass(eq=False)
class Ticket:
    """One watched message."""

    message: Leased
    delivery: Delivery
    key: str
    received_at: float
    """``time.monotonic()`` at receipt."""
    published_at: float
    """``time.time()`` of the publish, for the age gauge."""
    last_renewal: float
    job: TrackedJob | None = None
    attached_at: float = 0.0
    done: bool = False
    expire: Callable[[], None] | None = None
    """Concludes a held delivery past the cap (run on the keeper's pool), instead of a drop."""


class LeaseKeeper:
    """Renews leases of waiting messages and of jobs that progress; gives up stalls and caps."""

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
        self._lock = threading.Lock()  # guards _tickets, _thread and _pool
        self._tickets: set[Ticket] = set()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self.on_hold = OnHold(metrics)
        """The stock clients' messages on hold, released on each pass (:mod:`.on_hold`)."""

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
            pool, self._pool = self._pool, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if pool is not None:
            pool.shutdown(wait=False)

    def _submit(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the keeper's own small pool (started on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=2, thread_name_prefix="pubsub-worker-renew"
                )
            pool = self._pool
        try:
            pool.submit(work)
        except RuntimeError:  # shut down meanwhile: the worker is stopping
            pass

    def watch(
        self,
        message: Leased,
        delivery: Delivery,
        *,
        received_at: float,
        published_at: float,
        key: str = "?",
    ) -> Ticket:
        """Keep ``message`` leased from ``received_at`` until :meth:`forget`."""
        ticket = Ticket(message, delivery, key, received_at, published_at, received_at)
        self.on_hold.note(message)
        with self._lock:
            self._tickets.add(ticket)
        return ticket

    def attach(self, ticket: Ticket, job: TrackedJob, key: str, now: float | None = None) -> None:
        """The delivery claimed ``job``: from now on, renew only while it progresses."""
        now = time.monotonic() if now is None else now
        with self._lock:
            ticket.key = key
            ticket.job = job
            ticket.attached_at = now
            job.last_progress = max(job.last_progress, now)
            if ticket.received_at + self._max_processing_s <= now:
                job.abandoned = True  # it waited past the cap before it could start

    def hold(self, ticket: Ticket, expire: Callable[[], None]) -> None:
        """The message is held by the user's own threads: ``expire`` concludes it past the cap.

        A message whose cap passed before it was held (it waited for a thread
        past it) is expired at once.
        """
        with self._lock:
            ticket.expire = expire
            late = ticket.job is not None and ticket.job.abandoned
        if late:
            self._metrics.inc(Counter.ABANDONED)
            self._submit(expire)

    def forget(self, ticket: Ticket) -> None:
        """Stop watching; call when the delivery is settled, whatever the outcome."""
        with self._lock:
            ticket.done = True
            self._tickets.discard(ticket)

    def in_flight(self) -> int:
        """Jobs being processed now (claimed, not settled)."""
        with self._lock:
            return sum(1 for t in self._tickets if t.job is not None)

    def watched(self) -> int:
        """Messages in the worker's hands: waiting or running."""
        with self._lock:
            return len(self._tickets)

    def unsent(self) -> int:
        """Committed outbox entries of the jobs in flight that are not published yet."""
        with self._lock:
            jobs = [t.job for t in self._tickets if t.job is not None]
        return sum(job.unsent_count for job in jobs)

    def oldest_age_s(self) -> float:
        """Age in seconds of the oldest message in the worker's hands (since publish), or 0."""
        with self._lock:
            oldest = min((t.published_at for t in self._tickets), default=None)
        return 0.0 if oldest is None else max(time.time() - oldest, 0.0)

    def tick(self, now: float | None = None) -> None:
        """One pass over the watched messages (the thread calls it; tests may too)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tickets = list(self._tickets)
        for ticket in tickets:
            self._tick_one(ticket, now)

    def _tick_one(self, ticket: Ticket, now: float) -> None:
        job = ticket.job
        if ticket.done or ticket.delivery.lost:
            return
        if job is not None and job.abandoned:
            return
        if now - ticket.received_at > self._max_processing_s:
            self._abandon(ticket, now)
            return
        # Adopted by a newer delivery of its message (which renews its own, newer ack id):
        # this one's ack id is stale, so only its job's progress and Firestore lease matter.
        adopted = ticket.delivery.successor is not None
        due = not adopted and now - ticket.last_renewal >= self._lease_s / 2
        if job is None:
            if due:
                self._renew(ticket, now)
            return
        # Held (in the user's hands) or settling (acked or returned, its conclusion being
        # written): kept as the stock client keeps a message until its ack is answered.
        kept = job.held or job.settling
        if not kept and now - max(job.last_progress, ticket.attached_at) >= self._lease_s:
            ticket.delivery.give_up("no progress for a lease: the delivery was given up")
            self._metrics.inc(Counter.STALLED)
            _log(ticket).warning(
                "no progress for %.0f s; not renewed, Pub/Sub redelivers it",
                now - job.last_progress,
            )
            ticket.message.drop()
            return
        if due and (kept or job.last_progress > ticket.last_renewal):
            self._renew(ticket, now)
        if job.store_lease_due:
            self._submit(job.keep_alive)

    def _abandon(self, ticket: Ticket, now: float) -> None:
        """Past the cap: the job stops at its next boundary; a held message is concluded."""
        if ticket.job is not None:
            ticket.job.abandoned = True
        self._metrics.inc(Counter.ABANDONED)
        _log(ticket).warning(
            "abandoned after %.0f s (MAX_PROCESSING_SECONDS)", now - ticket.received_at
        )
        if ticket.expire is not None:
            self._submit(ticket.expire)  # a held message: a failed attempt, nacked
        else:
            ticket.message.drop()

    def _renew(self, ticket: Ticket, now: float) -> None:
        ticket.last_renewal = now
        log = _log(ticket)
        try:
            future = ticket.message.modify_ack_deadline_with_response(int(self._lease_s))
        except Exception:
            self._metrics.inc(Counter.RENEWAL_FAILURES)
            log.exception("lease renewal failed")
            return

        def done(f: Future[Any]) -> None:
            error = f.exception()
            if error is None:
                self._metrics.inc(Counter.RENEWALS)
                return
            self._metrics.inc(Counter.RENEWAL_FAILURES)
            if isinstance(error, AcknowledgeError) and error.error_code in LOST_STATUSES:
                if ticket.delivery.successor is not None:
                    return  # a newer delivery here adopted it: that one holds the message now
                ticket.delivery.give_up("Pub/Sub refused this delivery's ack id")
                log.warning("lease renewal refused (%s); ownership lost", error.error_code.name)
            else:
                log.warning("lease renewal failed: %s", error)

        future.add_done_callback(done)

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s * _jitter.uniform(0.8, 1.2)):
            try:
                self.tick()
            except Exception:  # the keeper must outlive any one bad job
                _LOGGER.exception("lease keeper pass failed")
            self.on_hold.release()  # never raises: a failure is logged once, then it stops


def _log(ticket: Ticket) -> JobLogger:
    return job_logger(_LOGGER, ticket.key, ticket.delivery.message_id)
