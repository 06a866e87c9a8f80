"""Concludes deliveries off their callback threads: the completion's write, then the ack.

A callback thread whose handler returned has nothing left to do but wait
for the completion's write and send the ack. :class:`Completer` takes that
tail (:meth:`DeliveryFlow.conclude_later
<pubsub_worker._worker.flow.DeliveryFlow.conclude_later>`), so the thread takes the
next message: with the client's default flow control the callback threads,
not Firestore, are what limits a worker, and that write is a large part of
their time (measured in ``docs/benchmarks.md``).

Nothing about the outcome changes: the completion is still durable before
the ack, the job's key stays held and its lease watched until the ack is
sent. Once closed (:meth:`close`, at shutdown) it takes nothing more and
each delivery concludes on its own callback thread again, so that every ack
is sent before the subscriber's stream closes; :meth:`reopen` (a worker
started again) takes conclusions again.

It also counts the deliveries an existing callback handed to its own threads
(:meth:`hold`): they are concluded by the ``ack()`` or ``nack()`` that comes
later, and :meth:`close` waits for them too.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["Completer"]


class Completer:
    """A pool of ``threads`` that runs conclusions, and counts those under way. Thread-safe."""

    def __init__(self, threads: int, *, taking: bool = True) -> None:
        self._threads = max(threads, 1)
        self._pool: ThreadPoolExecutor | None = self._new_pool() if taking else None
        self._cond = threading.Condition()  # guards _pending, _closed and _pool
        self._pending = 0
        self._closed = not taking
        self._spare: ThreadPoolExecutor | None = None  # runs what run_off gets while closed

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=self._threads, thread_name_prefix="pubsub-worker-complete"
        )

    @property
    def taking(self) -> bool:
        """Whether :meth:`submit` takes conclusions (read unlocked: it may refuse one still)."""
        return not self._closed

    def submit(self, conclusion: Callable[[], None]) -> bool:
        """Run ``conclusion`` on the pool; False (nothing done) once closed: run it yourself.

        It runs in a copy of the caller's context (``contextvars``): the
        delivery's trace span and log context go with it.
        """
        with self._cond:
            pool = self._pool
            if self._closed or pool is None:
                return False
            self._pending += 1
        context = contextvars.copy_context()
        try:
            pool.submit(context.run, self._run, conclusion)
        except RuntimeError:  # the pool shut down in between
            self._done()
            return False
        return True

    def run_off(self, work: Callable[[], None]) -> None:
        """Run ``work`` on a thread that may wait, open or closed; not counted (its caller is).

        For a conclusion that must go on off the thread that found it
        unfinished (a completion's write that failed, seen by the thread that
        sent it). Once closed, on a pool of the same size kept for this.
        """
        context = contextvars.copy_context()
        with self._cond:
            pool = self._pool if not self._closed else None
            if pool is None:
                if self._spare is None:
                    self._spare = ThreadPoolExecutor(
                        max_workers=self._threads, thread_name_prefix="pubsub-worker-settle"
                    )
                pool = self._spare
            pool.submit(context.run, work)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until no conclusion is under way; False if ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout_s)

    def hold(self) -> None:
        """Count a delivery held by the user's own threads until :meth:`unhold` (even closed)."""
        with self._cond:
            self._pending += 1

    def unhold(self) -> None:
        """The held delivery was concluded."""
        self._done()

    def close(self, timeout_s: float | None = None) -> bool:
        """Take nothing more; wait for the conclusions under way (False: some still are)."""
        with self._cond:
            self._closed = True
            pool = self._pool
        done = self.wait(timeout_s)
        if pool is not None:
            pool.shutdown(wait=done)
        return done

    def reopen(self, threads: int | None = None) -> None:
        """Take conclusions (again, after :meth:`close`); idempotent.

        ``threads``: the pool's size from now on, when it opens (at least 1):
        as many as the flow control admits, so that no finished job's
        conclusion waits for a thread while its flow-control slot is held. A
        pool starts a thread only when none is idle, so a large size costs
        threads only under that load. Ignored while already open.
        """
        with self._cond:
            if self._closed:
                if threads is not None:
                    self._threads = max(threads, 1)
                self._pool = self._new_pool()
                self._closed = False

    @property
    def threads(self) -> int:
        """The most conclusions run at once (the pool's size)."""
        return self._threads

    @property
    def pending(self) -> int:
        """Conclusions submitted and not yet done."""
        with self._cond:
            return self._pending

    def _run(self, conclusion: Callable[[], None]) -> None:
        try:
            conclusion()
        finally:
            self._done()

    def _done(self) -> None:
        with self._cond:
            self._pending -= 1
            if self._pending == 0:
                self._cond.notify_all()
