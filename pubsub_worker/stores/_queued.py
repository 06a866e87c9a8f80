"""One write queued for a shared ``BatchWrite`` RPC, how its outcome reaches its caller,
the queue the writes wait in, and which of them one request takes.

A caller of :meth:`~pubsub_worker.stores._batcher.WriteBatcher.submit` waits
for its write: it blocks on a lock held until the write is settled (one lock
per write, released once, instead of an ``Event``: a ``Condition``, its lock
and a waiter lock per wait, and a ``notify_all``). A caller of
:meth:`~pubsub_worker.stores._batcher.WriteBatcher.submit_then` does not: its
write carries a continuation, called once the batch is settled and its slot
given back, by the thread that sent it or, if that was another caller's, by a
flusher. That continuation must not block: it runs on a thread other writes
wait for. :class:`WriteQueue` holds the writes waiting for a batch;
:func:`next_batch` is which of them the next request takes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .base import Version

__all__ = ["QueuedWrite", "WriteQueue", "next_batch"]


class QueuedWrite:
    """One queued write and, once sent, its outcome."""

    __slots__ = (
        "_unsettled",
        "create",
        "data",
        "doc_path",
        "error",
        "queued_at",
        "sent",
        "settled",
        "size",
        "then",
        "version",
    )

    def __init__(
        self,
        doc_path: str,
        data: bytes,
        size: int,
        create: bool = False,
        then: Callable[[QueuedWrite], None] | None = None,
    ) -> None:
        self.doc_path = doc_path
        self.data = data
        """The serialized ``google.firestore.v1.Write``, precondition included."""
        self.size = size
        """Bytes the write adds to a ``BatchWrite`` request: :attr:`data`, framed."""
        self.create = create
        """A create: a job's first write (its claim)."""
        self.then = then
        """Called with this write once settled (:meth:`carry_on`); None: a caller waits."""
        self.queued_at = 0.0  # monotonic
        self.version: Version | None = None
        self.error: BaseException | None = None
        self.sent = False
        self.settled = False
        self._unsettled: Any = None
        if then is None:
            self._unsettled = threading.Lock()
            self._unsettled.acquire()

    def settle(self, version: Version | None, error: BaseException | None) -> None:
        """Record the outcome and wake the waiter; called once, by the sending thread.

        A continued write's continuation is called later (:meth:`carry_on`),
        once the batch's slot is free.
        """
        if self.settled:
            return
        self.version, self.error = version, error
        self.settled = True
        if self._unsettled is not None:
            self._unsettled.release()

    def carry_on(self) -> None:
        """Call the continuation of a settled write, once (nothing for a waited one)."""
        then, self.then = self.then, None
        if then is not None:
            then(self)

    def wait(self, timeout: float | None = None) -> bool:
        """True once settled; False if ``timeout`` passed first (a waited write only)."""
        if self._unsettled.acquire(timeout=-1 if timeout is None else timeout):
            self._unsettled.release()  # every later wait returns at once
            return True
        return False


def next_batch(
    queue: deque[QueuedWrite], busy: set[str], *, max_writes: int, room: int
) -> tuple[list[QueuedWrite], deque[QueuedWrite]]:
    """The queued writes one request takes, in queue order, and the queue left behind.

    At most ``max_writes`` writes, of at most ``room`` bytes (:attr:`QueuedWrite.size`),
    one per document, none to a document in ``busy`` (a batch in flight): two writes to
    one document could apply in either order. The oldest write that can go is always
    taken, however big: a write over ``room`` goes alone, and a write left for a later
    batch keeps its place, its document's later writes behind it.
    """
    batch: list[QueuedWrite] = []
    docs: set[str] = set()
    held: set[str] = set()  # documents of writes left for a later batch by their size
    kept: deque[QueuedWrite] = deque()
    while queue and len(batch) < max_writes:
        write = queue.popleft()
        doc = write.doc_path
        if doc in docs or doc in busy or doc in held:
            kept.append(write)  # one write per document per batch, in order
            continue
        if batch and write.size > room:
            kept.append(write)  # a later batch; its document's later writes stay behind it
            held.add(doc)
            continue
        room -= write.size
        docs.add(doc)
        batch.append(write)
    kept.extend(queue)
    return batch, kept


class WriteQueue:
    """The writes waiting for a batch, in order, and the documents of those in flight.

    Not thread-safe: the batcher's condition guards it. Its length is the
    writes waiting.
    """

    __slots__ = ("_writes", "busy", "bytes", "creates")

    def __init__(self) -> None:
        self._writes: deque[QueuedWrite] = deque()
        self.bytes = 0
        """The waiting writes' sizes: a lingering batch stops when full."""
        self.creates = 0
        """Waiting creates (a job's first write)."""
        self.busy: set[str] = set()
        """Documents with a write in flight."""

    def __len__(self) -> int:
        return len(self._writes)

    def append(self, write: QueuedWrite) -> None:
        self._writes.append(write)
        self.bytes += write.size
        self.creates += write.create

    def withdraw(self, write: QueuedWrite) -> bool:
        """Take back a write not yet sent (True); False if it was."""
        if write.sent:
            return False
        self._writes.remove(write)
        self.bytes -= write.size
        self.creates -= write.create
        return True

    def oldest_queued_at(self) -> float:
        return self._writes[0].queued_at

    def ready(self) -> bool:
        """Some waiting write's document has no write in flight."""
        return any(w.doc_path not in self.busy for w in self._writes)

    def writing(self) -> int:
        """Jobs with a write waiting or in flight (a batch holds one write per job)."""
        return len(self._writes) + len(self.busy)

    def pop_batch(self, *, max_writes: int, room: int) -> list[QueuedWrite]:
        """The writes of the next request (:func:`next_batch`), marked sent, their documents
        busy."""
        batch, self._writes = next_batch(self._writes, self.busy, max_writes=max_writes, room=room)
        for write in batch:
            write.sent = True
            self.creates -= write.create
            self.bytes -= write.size
            self.busy.add(write.doc_path)
        return batch

    def answered(self, batch: list[QueuedWrite]) -> None:
        """A batch is no longer in flight: its documents may go again."""
        self.busy.difference_update(w.doc_path for w in batch)
