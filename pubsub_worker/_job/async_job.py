"""``async def`` handlers: one event loop per worker, and the job they await.

An async handler runs on the worker's event loop (one loop per process, in
a named daemon thread), many jobs at once. The delivery around it is the
same as for a sync handler: the callback thread claims the job, hands the
coroutine to the loop, waits for it, then concludes the delivery (decide,
write, settle) off the loop. On the loop, every store write and publish of
a step runs in a bounded thread pool, so the loop never blocks on Firestore
or Pub/Sub; a transactional step goes through Firestore's async client.
What writes nothing (the checks before a step, staging its record for the
next write) runs on the loop itself, without a hand-off.

:class:`AsyncJob` is :class:`~pubsub_worker._job.job.Job` awaited, a face over
the same :class:`~pubsub_worker._job.core.JobCore`: the same fences, checked
at every ``await job.*`` (``LostOwnership``,
``ProcessingTimeout`` and ``ShuttingDown`` are raised there), the same
records. A step whose task is cancelled while its function runs records
nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, overload

from .core import JobCore
from .job import BaseJob
from .records import Recorded

__all__ = ["AsyncJob", "EventLoopThread", "flush_queued"]

T = TypeVar("T")

IO_THREADS = 32
"""Threads that carry the blocking store writes and publishes of async steps."""


class EventLoopThread:
    """An event loop running in its own named daemon thread; idempotent start and stop."""

    def __init__(self, name: str = "pubsub-worker-loop") -> None:
        self._name = name
        self._lock = threading.Lock()  # guards _loop, _thread, _io, _running
        self._running: set[concurrent.futures.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._io: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
                self._io = concurrent.futures.ThreadPoolExecutor(
                    max_workers=IO_THREADS, thread_name_prefix="pubsub-worker-io"
                )
            return self._loop

    @property
    def io(self) -> concurrent.futures.ThreadPoolExecutor:
        """The bounded pool for blocking work of async steps."""
        self.start()
        assert self._io is not None
        return self._io

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it in the calling thread.

        Raises ``concurrent.futures.CancelledError`` if :meth:`cancel_running`
        (or :meth:`stop`) cancelled it.
        """
        loop = self.start()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        with self._lock:
            self._running.add(future)
        try:
            return future.result()
        finally:
            with self._lock:
                self._running.discard(future)

    def cancel_running(self) -> int:
        """Cancel every coroutine :meth:`run` is waiting for (the handlers'); how many.

        For an ``async def`` handler, cancellation is the cooperative stop: a
        task awaiting a long call (no ``job.*`` boundary in sight) ends at once.
        """
        with self._lock:
            running = list(self._running)
        for future in running:
            future.cancel()
        return len(running)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop and its pool; tasks still running are cancelled."""
        with self._lock:
            loop, thread, io = self._loop, self._thread, self._io
            self._loop = self._thread = self._io = None
        if loop is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # a task that will not end: the daemon thread goes with the process
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout_s)
        if not loop.is_running():
            loop.close()
        if io is not None:
            io.shutdown(wait=False)


class AsyncJob(BaseJob):
    """The job an ``async def`` handler gets: :class:`~pubsub_worker._job.job.Job`, awaited.

    ``await job.step(name, fn)`` takes a sync or an async ``fn``;
    ``await job.transactional_step(name, fn)`` gives ``fn`` a
    ``google.cloud.firestore.AsyncTransaction``; ``job.publish(...)`` is not
    awaited (inside a step it joins the step's outbox; outside any step it
    becomes a step of its own, committed at the next ``await job.*`` or
    before the job completes); ``await job.heartbeat()``.
    """

    def __init__(self, core: JobCore, io: concurrent.futures.Executor) -> None:
        super().__init__(core)
        self._io = io

    @overload
    async def step(self, name: str, fn: Callable[[], Awaitable[T]]) -> T: ...

    @overload
    async def step(self, name: str, fn: Callable[[], T]) -> T: ...

    async def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` once for this job; as :meth:`pubsub_worker.Job.step`.

        An async ``fn`` is awaited on the loop; a sync one runs in the worker's
        I/O pool, so it cannot block the loop. If the task is cancelled while
        ``fn`` runs, nothing is recorded.
        """
        await flush_queued(self)
        return await self._step(name, fn)

    async def _step(self, name: str, fn: Callable[[], Any]) -> Any:
        """:meth:`step`, without first committing what was queued outside any step."""
        core = self._core
        recorded = await self._open(name)
        if recorded is not None:
            return recorded.value
        with core.measured(name):
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn()
                else:
                    value = await self._call(fn)
                    if inspect.isawaitable(value):
                        value = await value
            finally:
                core.leave_step()
            return await self._record(name, value)

    async def transactional_step(self, name: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``await fn(transaction)`` and record the step in the same Firestore transaction.

        As :meth:`pubsub_worker.Job.transactional_step`, with an
        ``AsyncTransaction`` from Firestore's async client.
        """
        await flush_queued(self)
        core = self._core
        recorded = core.begin_step(name)
        if recorded is not None:
            return recorded.value  # type: ignore[no-any-return]
        parts = core.transaction_parts(name)

        async def body(transaction: Any) -> T:
            core.enter_step(name)
            try:
                return await fn(transaction)
            finally:
                core.leave_step()

        with core.measured(name):
            await core.document.transact_async(body, parts.changes, parts.adopt)
            return await self._call(core.finish_transaction, parts)

    def publish(self, topic: str, data: bytes, **attributes: str) -> None:
        """Publish a message exactly once for this job; as :meth:`pubsub_worker.Job.publish`."""
        core = self._core
        if core.current_step is not None:
            core.publish(topic, data, attributes)
            return
        core.defer(core.prepare(topic, data, attributes))

    async def heartbeat(self) -> None:
        """Report progress; raises ``LostOwnership`` if this delivery no longer owns the job."""
        await flush_queued(self)
        if self._core.beat():
            await self._call(self._core.document.write)

    # What writes nothing runs on the loop: a hand-off to the pool and back costs more
    # CPU than the bookkeeping itself. A write, or staging while a renewal writes, goes
    # to the pool, so the loop never waits for Firestore.

    async def _open(self, name: str) -> Recorded | None:
        """``JobCore.open_step``: on the loop unless the previous step's record is written."""
        core = self._core
        with core.document.unless_busy() as free:
            if free and not core.record_staged:
                return core.open_step(name)  # nothing to write
        return await self._call(core.open_step, name)

    async def _record(self, name: str, value: Any) -> Any:
        """``JobCore.record_step``: staged on the loop; a write due now runs in the pool."""
        core = self._core
        with core.document.unless_busy() as free:
            staged = core.stage_step(name, value) if free else None
        if staged is None:
            return await self._call(core.record_step, name, value)
        if staged.write_now:
            await self._call(core.write_step, name, staged)
        return staged.value

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(fn, *args))


async def flush_queued(job: AsyncJob) -> None:
    """Commit and publish what ``job.publish()`` queued outside any step, each a step of its own.

    Run before every ``await job.*`` and after the handler returned, before the completion.
    In the order they were queued, one after the other (never a step inside another's flush).
    """
    core = job._core
    while (outgoing := core.next_deferred()) is not None:
        await job._step(core.publish_step_name(), functools.partial(core.queue, outgoing))
