"""The write batcher: a queue of single-document writes sent in shared ``BatchWrite`` RPCs.

:class:`WriteBatcher` queues raw ``Write`` protobufs, each serialized once, and sends
them together in one ``BatchWrite`` RPC (group commit), ``max_in_flight`` batches at a
time (one by default). A write that finds a slot free is sent at once by the thread that
brings it, with whatever else is queued (a request refused for its size, over 10 MiB in
production or 4 MiB on the emulator, fails every write in it: ``max_batch_bytes``);
the others wait for a flusher, which sends them in one batch as a slot frees. At low
load a batch holds one write and nothing waits for a timer or another thread. A caller
waits for its write (:meth:`WriteBatcher.submit`), or hands on a continuation
(:meth:`WriteBatcher.submit_then`, :mod:`~pubsub_worker.stores._queued`), run by the
flusher that sent it or by the write's own caller's thread, never by another job's: a
caller that sends other jobs' continued writes leaves theirs to a flusher. Continued
writes are sent before the interpreter exits.

Long round trips are not left to add up (:class:`~._slots.Slots` has the rules): a
write waits 1-5 ms for a slot, not a whole round trip, and while no batch flies one is
held open up to ``gather_s`` (2 ms) for the writes of the worker's other jobs: the
jobs of one pull response share an RPC. A batch never holds two writes to one
document (they could apply in either order), nor is a document in two batches in
flight. Each write's outcome is its own (``BatchWrite`` is not atomic); settling an
unknown one is the store's part (:mod:`pubsub_worker.stores.batching`); the raw RPC
is :mod:`pubsub_worker.stores._batch_rpc`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pubsub_worker._support.limits import MAX_BATCH_WRITE_BYTES
from pubsub_worker.errors import StoreError

from ._batch_rpc import batch_write_call, send_batch
from ._flushers import Flushers
from ._queued import QueuedWrite, WriteQueue
from ._slots import Slots
from ._writes import framed_bytes
from .base import Version

__all__ = ["IDLE_EXIT_S", "MAX_BATCH_WRITES", "WriteBatcher"]

_LOGGER = logging.getLogger(__name__)

MAX_BATCH_WRITES = 500
"""Firestore's limit of writes in one BatchWrite request."""
IDLE_EXIT_S = 10.0
"""A flusher thread idle this long ends; the next write starts another."""


class WriteBatcher:
    """Sends queued single-document writes in shared ``BatchWrite`` RPCs. Thread-safe.

    Its :attr:`slots` say when a batch may go (``max_in_flight``, ``slow_in_flight``,
    ``slow_after_s``, ``long_wait_s``, ``gather_s``; the worker sets ``slots.writers``). A
    write that finds a slot free is sent by its own thread; the others by up to
    ``slow_in_flight`` flusher threads (started when a write has to wait, ended once idle
    for ``idle_exit_s``); ``rpc_timeout_s`` bounds each RPC. A batch holds at most
    ``max_batch`` writes and ``max_batch_bytes`` of serialized request (1 to
    :data:`~pubsub_worker._support.limits.MAX_BATCH_WRITE_BYTES`); a single larger write
    goes alone (Firestore refuses it, and only it).
    """

    def __init__(
        self,
        client: firestore.Client,
        *,
        rpc_timeout_s: float = 10.0,
        max_batch: int = 100,
        max_in_flight: int = 1,
        slow_in_flight: int = 4,
        slow_after_s: float = 0.005,
        long_wait_s: float = 0.001,
        gather_s: float = 0.002,
        linger_s: float = 0.0,
        max_batch_bytes: int = MAX_BATCH_WRITE_BYTES,
        idle_exit_s: float = IDLE_EXIT_S,
    ) -> None:
        if not 1 <= max_batch <= MAX_BATCH_WRITES:
            raise ValueError(f"max_batch must be 1..{MAX_BATCH_WRITES}")
        if not 1 <= max_batch_bytes <= MAX_BATCH_WRITE_BYTES:
            raise ValueError(f"max_batch_bytes must be 1..{MAX_BATCH_WRITE_BYTES}")
        self.slots = Slots(
            max_in_flight=max_in_flight,
            slow_in_flight=slow_in_flight,
            slow_after_s=slow_after_s,
            long_wait_s=long_wait_s,
            gather_s=gather_s,
        )
        self._call, self._metadata = batch_write_call(client)
        self._database: str = client._database_string
        self._rpc_timeout_s = rpc_timeout_s
        self._max_batch = max_batch
        # What the writes of one batch may add to the request's own field (its database).
        self._write_budget = max_batch_bytes - framed_bytes(len(self._database.encode()))
        self._linger_s = linger_s
        self._idle_exit_s = idle_exit_s
        self._cond = threading.Condition()  # guards everything below
        self._queue = WriteQueue()
        self._timed = False  # a flusher waits for the slow slots to open
        self._holding = False  # a flusher holds a batch open for other jobs' writes
        self._flushers = Flushers(self._flush_forever)
        self._closed = False
        self._continuing = 0  # writes queued by submit_then, not yet carried on
        self._handed: deque[list[QueuedWrite]] = deque()  # continued writes left to a flusher
        self._exit_waiters = 0
        atexit.register(_wait_at_exit, weakref.ref(self))
        self.batches = 0
        """Batches sent so far."""
        self.writes = 0
        """Writes sent so far (``writes / batches`` is the mean batch size)."""

    def submit(self, write_pb: Any, *, create: bool = False) -> Version:
        """Queue one raw ``Write`` protobuf (``create``: a job's first); wait for its outcome.

        Raises the write's error: ``AlreadyExists``, ``FailedPrecondition``,
        ``NotFound`` for a failed precondition; any other
        ``GoogleAPICallError`` when the outcome is unknown or the write was
        rejected. A write still queued after the wait budget is withdrawn and
        ``ServiceUnavailable`` raised (it was never sent).
        """
        write = self._queue_write(write_pb, create, None)
        if not write.wait(self._rpc_timeout_s + 5.0):
            with self._cond:
                if self._queue.withdraw(write):
                    raise gexc.ServiceUnavailable(  # type: ignore[no-untyped-call]
                        "the write waited too long for a batch"
                    )
            write.wait()  # in flight: the RPC's own timeout ends it
        if write.error is not None:
            raise write.error
        return write.version

    def submit_then(self, write_pb: Any, then: Callable[[QueuedWrite], None]) -> None:
        """Queue one raw ``Write`` protobuf (an update); ``then(write)`` once it is settled.

        Returns at once, unless a batch slot is free: then this thread sends the batch and
        calls ``then`` before it returns (the other jobs' continuations go to a flusher).
        ``then`` runs once the slot is given back. A closed batcher raises ``StoreError``.
        """
        self._queue_write(write_pb, False, then)

    def _queue_write(
        self, write_pb: Any, create: bool, then: Callable[[QueuedWrite], None] | None
    ) -> QueuedWrite:
        """Queue a write; send its batch on this thread if a slot is free (no hand-off)."""
        # Serialized once, here, outside the lock: its size, and its part of the request.
        data = write_pb.SerializeToString()
        write = QueuedWrite(write_pb.update.name, data, framed_bytes(len(data)), create, then)
        batch: list[QueuedWrite] = []
        with self._cond:
            if self._closed:
                raise StoreError("the job store is closed")
            self._continuing += then is not None
            write.queued_at = now = time.monotonic()
            self._queue.append(write)
            if self._linger_s == 0 and self._ready() and self._hold_for(now) is None:
                batch = self._pop_batch()  # a slot is free: this thread sends, no hand-off
            if self._queue:
                self._start_flushers()
                self._wake_flusher()
        if batch:
            self._run(batch, own=write)
        return write

    def close(self) -> None:
        """Stop the flushers once the queue is empty; later writes raise ``StoreError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._flushers.threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self._rpc_timeout_s + 5.0)

    def _start_flushers(self) -> None:
        self._flushers.top_up(self.slots.most, len(self._handed))

    def _wait(self, timeout_s: float) -> bool:
        return self._flushers.wait(self._cond, timeout_s)

    def _run(self, batch: list[QueuedWrite], *, own: QueuedWrite | None = None) -> None:
        """Send a popped batch, settle every write in it, free its slot, then carry on.

        ``own``: the caller's write whose thread sends; None: a flusher sends. Continuations
        run once the slot is free: a caller's thread runs its own write's only, the other
        jobs' go to a flusher (a hook that blocks never holds up its job). A flusher with
        none takes the next batch itself (:meth:`_flush_forever` loops), waking no other;
        one with some leaves it to another (started if need be), so that a slow
        continuation holds up no write queued behind it.
        """
        mine = [w for w in batch if w.then is not None and (own is None or w is own)]
        theirs = [] if own is None else [w for w in batch if w.then is not None and w is not own]
        round_trip_s: float | None = None
        started = time.monotonic()
        try:
            try:
                self._send(batch)
                round_trip_s = time.monotonic() - started
            except BaseException as exc:  # never leave a caller waiting (settled ones stay)
                for write in batch:
                    write.settle(None, exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                with self._cond:
                    self._queue.answered(batch)
                    self.slots.give_back(round_trip_s)
                    if theirs and self._closed:  # no flusher to hand them to
                        mine, theirs = mine + theirs, []
                    if own is None and mine:
                        self._flushers.carrying += 1
                    if theirs:
                        self._handed.append(theirs)
                    if (self._queue or theirs) and (own is not None or mine):
                        if not self._closed:
                            self._start_flushers()
                        self._wake_flusher()
        finally:
            if mine:
                self._carry_on(mine, flusher=own is None)

    def _carry_on(self, writes: list[QueuedWrite], *, flusher: bool) -> None:
        """Run settled writes' continuations (a flusher's counted as carrying meanwhile)."""
        try:
            for write in writes:
                try:
                    write.carry_on()
                except Exception:  # a continuation's own failure: never the batch's
                    _LOGGER.exception("a write's continuation failed")
        finally:
            with self._cond:
                self._flushers.carrying -= flusher
                self._continuing -= len(writes)
                if self._exit_waiters and not self._continuing:
                    self._cond.notify_all()

    def _flush_forever(self) -> None:
        try:
            while (taken := self._take()) is not None:
                batch, handed = taken
                if handed:
                    self._carry_on(batch, flusher=True)
                else:
                    self._run(batch)
        finally:
            with self._cond:
                self._flushers.leave()
                if (self._queue or self._handed) and not self._closed:
                    self._start_flushers()  # a write came in as this flusher ended

    def _take(self) -> tuple[list[QueuedWrite], bool] | None:
        """The next batch, never empty, its documents marked busy; or (True) continued writes
        handed on to be carried on. None when this flusher should end (:meth:`_idle`)."""
        with self._cond:
            while True:
                if self._handed:
                    self._flushers.carrying += 1
                    return self._handed.popleft(), True
                if not self._ready():
                    if not self._idle():
                        self._flushers.leave()
                        return None
                    continue
                hold = self._hold_for(time.monotonic())
                if hold is not None:  # other jobs' writes may join: see the module's doc
                    self._holding = True  # the writes that leave the hold on wake no one
                    try:
                        self._wait(hold)
                    finally:
                        self._holding = False
                    continue
                if self._linger_s > 0:
                    self._linger()
                batch = self._pop_batch()
                if batch:  # else another flusher took them while this one lingered
                    return batch, False

    def _idle(self) -> bool:
        """Wait once, with nothing to do; False: this flusher should end, closed and drained or
        idle for ``idle_exit_s`` (the next write starts a new one)."""
        if self._closed and not self._queue:
            return False
        opens = self._slow_opens_in()  # 0.0: open, but every queued doc is busy
        if opens and not self._timed:
            self._timed = True  # this flusher sends when the slow slots open
            try:
                self._wait(opens)
            finally:
                self._timed = False
            return True
        return self._wait(self._idle_exit_s) or bool(self._queue or self._handed)

    def _linger(self) -> None:
        """Hold the next batch open ``linger_s``, or until it is full."""
        deadline = time.monotonic() + self._linger_s
        while not self._full() and (remaining := deadline - time.monotonic()) > 0:
            self._wait(remaining)

    def _full(self) -> bool:
        """The queued writes would fill a batch (``max_batch`` or ``max_batch_bytes``)."""
        return len(self._queue) >= self._max_batch or self._queue.bytes >= self._write_budget

    def _pop_batch(self) -> list[QueuedWrite]:
        """Queued writes for one request (:meth:`~._queued.WriteQueue.pop_batch`), at most
        ``max_batch`` writes and ``max_batch_bytes`` with the request's own field."""
        batch = self._queue.pop_batch(max_writes=self._max_batch, room=self._write_budget)
        if batch:
            self.slots.take(time.monotonic())
        if len(self._flushers) > 1:
            self._wake_flusher()  # another flusher can take the rest
        return batch

    def _wake_flusher(self) -> None:
        """Wake one flusher if it has something to do: a batch slot free and a write ready.

        (With every slot busy it would find nothing to send: the slot's sender
        wakes one.) A lingering flusher is woken for every write; while a slow
        slot will open, one flusher is woken to wait for it, unless one does.
        A flusher holding a batch open is not woken while the hold lasts: it
        sends when it ends, and the write that ends it early (the last job
        without one brings it) is sent by its own thread. Continued writes handed on
        wake one more.
        """
        if self._handed:
            self._cond.notify(1 + self._exit_waiters)  # a flusher, whoever else waits
        if self._holding and self._hold_for(time.monotonic()) is not None:
            return
        if self._queue and (
            self._linger_s > 0
            or self._ready()
            or (not self._timed and self._slow_opens_in() is not None)
        ):
            self._cond.notify()

    def _ready(self) -> bool:
        """A batch slot is free and some queued write's document is not in flight."""
        return self.slots.free(time.monotonic(), self._queue.writing()) and self._queue.ready()

    def _slow_opens_in(self) -> float | None:
        """Seconds until a slow slot opens for the queued writes (:meth:`Slots.slow_opens_in`)."""
        if not self._queue:
            return None
        return self.slots.slow_opens_in(time.monotonic(), self._queue.writing())

    def _hold_for(self, now: float) -> float | None:
        """Seconds to hold the next batch open for other jobs' writes; None: send it now."""
        if self._linger_s > 0 or not self._queue or self._full():
            return None
        return self.slots.hold_for(
            self._queue.oldest_queued_at(),
            now,
            writing=self._queue.writing(),
            claims=self._queue.creates > 0,
        )

    def _send(self, batch: list[QueuedWrite]) -> None:
        self.batches += 1
        self.writes += len(batch)
        send_batch(
            self._call,
            batch,
            database=self._database,
            timeout=self._rpc_timeout_s,
            metadata=self._metadata,
        )

    def wait_continued(self, timeout_s: float | None = None) -> bool:
        """Wait until every write of :meth:`submit_then` was sent and carried on (False:
        ``timeout_s`` passed first). Also at interpreter exit: its caller did not wait, and
        the flushers are daemon threads."""
        with self._cond:
            self._exit_waiters += 1
            try:
                return self._cond.wait_for(lambda: self._continuing == 0, timeout_s)
            finally:
                self._exit_waiters -= 1


def _wait_at_exit(ref: weakref.ref[WriteBatcher]) -> None:
    batcher = ref()
    if batcher is not None and not batcher.wait_continued(batcher._rpc_timeout_s + 5.0):
        _LOGGER.warning("exiting with continued writes not yet settled")
