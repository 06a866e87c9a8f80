"""The write batcher: a queue of single-document writes sent in shared ``BatchWrite`` RPCs.

:class:`WriteBatcher` queues raw ``Write`` protobufs and sends them together
in one ``BatchWrite`` RPC (group commit), at most ``max_in_flight`` batches
at a time (one by default). A write that finds a batch slot free is sent at
once by the thread that brings it, with whatever else is queued (at most
``max_batch`` writes and ``max_batch_bytes`` of serialized request, 4 MB by
default: a request refused for its size, over 10 MiB in production or 4 MiB
on the emulator, fails every write in it); writes that arrive while every
slot is busy wait for a flusher, which sends them in one batch as a slot
frees. At low load a batch holds one write and nothing waits for a timer or
another thread (``linger_s`` holds each batch open longer, on a flusher:
fewer RPCs, more latency).

Long round trips are not left to add up (:class:`~._slots.Slots` has the
rules): a write waits ``slow_after_s`` (5 ms) for a slot at most, not a
whole round trip; and while round trips are long and no batch flies, a
batch is held open up to ``gather_s`` (2 ms) for the writes of the
worker's other jobs, so the jobs of one pull response claim, and complete,
in one RPC and their acks reach the client's dispatcher together. On
loopback the slow slots mostly stay shut, nothing is held open, and the
writes that arrive meanwhile share the next batch (``docs/benchmarks.md``
has the figures). A batch never holds two writes to one document (they
could apply in either order), nor is a document in two batches in flight.

Each write's outcome is its own (``BatchWrite`` is not atomic); settling an
unknown one is the store's part (:mod:`pubsub_worker.stores.batching`); the
raw RPC on the client's own channel is :mod:`pubsub_worker.stores._batch_rpc`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.cloud import firestore

from pubsub_worker._support.limits import MAX_BATCH_WRITE_BYTES
from pubsub_worker.errors import StoreError

from ._batch_rpc import batch_write_call, failed, outcomes, request
from ._slots import Slots
from ._writes import framed_bytes
from .base import Version

__all__ = ["IDLE_EXIT_S", "MAX_BATCH_WRITES", "WriteBatcher"]

_LOGGER = logging.getLogger(__name__)

MAX_BATCH_WRITES = 500
"""Firestore's limit of writes in one BatchWrite request."""
IDLE_EXIT_S = 10.0
"""A flusher thread idle this long ends; the next write starts another."""


def _held_lock() -> Any:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Write:
    """One queued write and, once sent, its outcome.

    Its waiter blocks on a lock held until the write is settled: one lock
    per write, released once, instead of an ``Event`` (a ``Condition``, its
    lock and a waiter lock per wait, and a ``notify_all``).
    """

    doc_path: str
    pb: Any
    """The raw ``google.firestore.v1.Write`` protobuf, precondition included."""
    size: int
    """Bytes the write adds to a ``BatchWrite`` request: its serialized protobuf, framed."""
    create: bool = False
    """A create: a job's first write (its claim)."""
    queued_at: float = 0.0  # monotonic
    version: Version | None = None
    error: BaseException | None = None
    sent: bool = False
    settled: bool = False
    _unsettled: Any = field(default_factory=_held_lock, repr=False)

    def settle(self, version: Version | None, error: BaseException | None) -> None:
        """Record the outcome and wake the waiter; called once, by the sending thread."""
        if self.settled:
            return
        self.version, self.error = version, error
        self.settled = True
        self._unsettled.release()

    def wait(self, timeout: float | None = None) -> bool:
        """True once settled; False if ``timeout`` passed first."""
        if self._unsettled.acquire(timeout=-1 if timeout is None else timeout):
            self._unsettled.release()  # every later wait returns at once
            return True
        return False


class WriteBatcher:
    """Sends queued single-document writes in shared ``BatchWrite`` RPCs. Thread-safe.

    Its :attr:`slots` say when a batch may go (``max_in_flight``,
    ``slow_in_flight``, ``slow_after_s``, ``gather_s``; the worker sets
    ``slots.writers``). A write that finds a slot free is sent by its own
    thread; the others by up to ``slow_in_flight`` flusher threads (started
    when a write has to wait, ended once idle for ``idle_exit_s``);
    ``rpc_timeout_s`` bounds each RPC. A batch holds at most ``max_batch``
    writes and ``max_batch_bytes`` of serialized request (1 to
    :data:`~pubsub_worker._support.limits.MAX_BATCH_WRITE_BYTES`); a single
    larger write goes alone (Firestore refuses it, and only it).
    :meth:`submit` blocks until its write's outcome is known and returns
    the new update time, or raises the write's own ``GoogleAPICallError``.
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
        self._queue: deque[_Write] = deque()
        self._queued_bytes = 0  # the queued writes' sizes: a lingering batch stops when full
        self._queued_creates = 0
        self._busy_docs: set[str] = set()
        self._timed = False  # a flusher waits for the slow slots to open
        self._threads: list[threading.Thread] = []
        self._started = 0
        self._closed = False
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
        # Sized once, here, outside the lock (ByteSize() serializes the write).
        write = _Write(write_pb.update.name, write_pb, framed_bytes(write_pb.ByteSize()), create)
        batch: list[_Write] = []
        with self._cond:
            if self._closed:
                raise StoreError("the job store is closed")
            write.queued_at = now = time.monotonic()
            self._queue.append(write)
            self._queued_bytes += write.size
            self._queued_creates += create
            if self._linger_s == 0 and self._ready() and self._hold_for(now) is None:
                batch = self._pop_batch()  # a slot is free: this thread sends, no hand-off
            if self._queue:
                self._start_flushers()
                self._wake_flusher()
        if batch:
            self._run(batch)
        if not write.wait(self._rpc_timeout_s + 5.0):
            with self._cond:
                if not write.sent:
                    self._queue.remove(write)
                    self._queued_bytes -= write.size
                    self._queued_creates -= write.create
                    raise gexc.ServiceUnavailable(  # type: ignore[no-untyped-call]
                        "the write waited too long for a batch"
                    )
            write.wait()  # in flight: the RPC's own timeout ends it
        if write.error is not None:
            raise write.error
        return write.version

    def close(self) -> None:
        """Stop the flushers once the queue is empty; later writes raise ``StoreError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self._rpc_timeout_s + 5.0)

    # -- flushers ---------------------------------------------------------------------

    def _start_flushers(self) -> None:
        while len(self._threads) < self.slots.most:
            self._started += 1
            thread = threading.Thread(
                target=self._flush_forever,
                name=f"pubsub-worker-batch-writer-{self._started}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _run(self, batch: list[_Write], *, flusher: bool = False) -> None:
        """Send a popped batch, settle every write in it, free its slot.

        A flusher takes the next batch itself (:meth:`_flush_forever` loops): it
        wakes no other for it.
        """
        round_trip_s: float | None = None
        started = time.monotonic()
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
                self._busy_docs.difference_update(w.doc_path for w in batch)
                self.slots.give_back(round_trip_s)
                if self._queue and not flusher:
                    if not self._closed:
                        self._start_flushers()
                    self._wake_flusher()

    def _flush_forever(self) -> None:
        try:
            while (batch := self._take()) is not None:
                self._run(batch, flusher=True)
        finally:
            with self._cond:
                me = threading.current_thread()
                if me in self._threads:
                    self._threads.remove(me)
                if self._queue and not self._closed:
                    self._start_flushers()  # a write came in as this flusher ended

    def _take(self) -> list[_Write] | None:
        """The next batch, never empty; marks its documents busy.

        None when this flusher should end: closed and drained, or idle for
        ``idle_exit_s`` (the next write starts a new one).
        """
        with self._cond:
            while True:
                while not self._ready():
                    if self._closed and not self._queue:
                        self._threads.remove(threading.current_thread())
                        return None
                    opens = self._slow_opens_in()  # 0.0: open, but every queued doc is busy
                    if opens and not self._timed:
                        self._timed = True  # this flusher sends when the slow slots open
                        try:
                            self._cond.wait(opens)
                        finally:
                            self._timed = False
                        continue
                    if not self._cond.wait(self._idle_exit_s) and not self._queue:
                        self._threads.remove(threading.current_thread())
                        return None
                hold = self._hold_for(time.monotonic())
                if hold is not None:  # other jobs' writes may join: see the module's doc
                    self._cond.wait(hold)
                    continue
                if self._linger_s > 0:
                    deadline = time.monotonic() + self._linger_s
                    while (
                        len(self._queue) < self._max_batch
                        and self._queued_bytes < self._write_budget
                    ):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                batch = self._pop_batch()
                if batch:  # else another flusher took them while this one lingered
                    return batch

    def _pop_batch(self) -> list[_Write]:
        """Queued writes for one request, in queue order; marks their documents busy.

        At most ``max_batch`` writes, of at most ``max_batch_bytes`` with the
        request's own field, one per document, none to a busy document. The
        oldest write that can go is always taken, however big: a write over
        the cap goes alone, and a write left for a later batch keeps its place.
        """
        batch: list[_Write] = []
        docs: set[str] = set()
        held: set[str] = set()  # documents of writes left for a later batch by their size
        kept: deque[_Write] = deque()
        room = self._write_budget
        while self._queue and len(batch) < self._max_batch:
            write = self._queue.popleft()
            doc = write.doc_path
            if doc in docs or doc in self._busy_docs or doc in held:
                kept.append(write)  # one write per document per batch, in order
                continue
            if batch and write.size > room:
                kept.append(write)  # a later batch; its document's later writes stay behind it
                held.add(doc)
                continue
            room -= write.size
            docs.add(doc)
            write.sent = True
            self._queued_creates -= write.create
            batch.append(write)
        kept.extend(self._queue)
        self._queue = kept
        self._queued_bytes -= self._write_budget - room
        self._busy_docs.update(docs)
        if batch:
            self.slots.take(time.monotonic())
        if len(self._threads) > 1:
            self._wake_flusher()  # another flusher can take the rest
        return batch

    def _wake_flusher(self) -> None:
        """Wake one flusher if it has something to do: a batch slot free and a write ready.

        With every slot busy a woken flusher would only find nothing to send
        and wait again (the slot's sender wakes one when it is done); a
        lingering flusher is woken for every write, to see its batch fill;
        while a slow slot will open, one flusher is woken to wait for it,
        unless one already does.
        """
        if self._queue and (
            self._linger_s > 0
            or self._ready()
            or (not self._timed and self._slow_opens_in() is not None)
        ):
            self._cond.notify()

    def _ready(self) -> bool:
        """A batch slot is free and some queued write's document is not in flight."""
        if not self.slots.free(time.monotonic()):
            return False
        return any(w.doc_path not in self._busy_docs for w in self._queue)

    def _slow_opens_in(self) -> float | None:
        """Seconds until a slow slot opens for the queued writes (:meth:`Slots.slow_opens_in`)."""
        return self.slots.slow_opens_in(time.monotonic()) if self._queue else None

    def _hold_for(self, now: float) -> float | None:
        """Seconds to hold the next batch open for other jobs' writes; None: send it now."""
        if self._linger_s > 0 or not self._queue or len(self._queue) >= self._max_batch:
            return None
        if self._queued_bytes >= self._write_budget:
            return None
        writing = len(self._queue) + len(self._busy_docs)  # a write each, queued or in flight
        return self.slots.hold_for(
            self._queue[0].queued_at, now, writing=writing, claims=self._queued_creates > 0
        )

    def _send(self, batch: list[_Write]) -> None:
        self.batches += 1
        self.writes += len(batch)
        sent = request(self._database, [w.pb for w in batch])
        try:
            response = self._call(sent, timeout=self._rpc_timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = failed(exc)
            _LOGGER.debug("BatchWrite of %d writes failed: %s", len(batch), error)
            for write in batch:
                write.settle(None, error)
            return
        for write, (version, write_error) in zip(
            batch, outcomes(response, len(batch)), strict=True
        ):
            write.settle(version, write_error)
