"""A Firestore job store that carries concurrent writes in shared BatchWrite RPCs.

Under load a worker has many jobs in flight, each waiting on its own claim
(``create``) or commit (``update``). :class:`BatchingFirestoreJobStore`
hands those writes to a :class:`~pubsub_worker.stores._batcher.WriteBatcher`,
which sends them together in one ``BatchWrite`` RPC (group commit), at most
``max_in_flight`` batches at a time (more, up to ``slow_in_flight``, while
the RPCs in flight are slow), each of at most ``max_batch`` writes
and ``max_batch_bytes`` of serialized request (4 MB by default). At low load
a batch holds one write and nothing waits for a timer or another thread.

The semantics are those of :class:`~pubsub_worker.stores.firestore.FirestoreJobStore`,
write by write. ``BatchWrite`` is not atomic: each write carries its own
precondition (create-if-absent, or the expected update time) and succeeds or
fails alone, with its own status and update time in the response, so one
stale owner's write fails without touching the others. A batch never holds
two writes to one document (they could apply in either order), and a
document is never in two batches in flight at once. A write whose outcome is
unknown (the RPC failed or timed out, or the write's own status is
transient) is settled by reading the document back and comparing its
``write_id``; if it was not applied it is sent again, and should that retry
then fail its precondition, the document is read once more: a first attempt
that landed late is recognised as this write, not reported as a conflict.
Reads and transactions are not batched.

Writes are built as raw protobufs (:mod:`pubsub_worker.stores._writes`),
serialized once as they are queued, and sent as a ``BatchWrite`` request
framed from those bytes on the client's own gRPC channel
(:mod:`pubsub_worker.stores._batch_rpc`); what that saves is measured in
``docs/benchmarks-history.md``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from google.cloud import firestore

from pubsub_worker._support.limits import MAX_BATCH_WRITE_BYTES

from ._batcher import IDLE_EXIT_S, WriteBatcher
from ._queued import QueuedWrite
from ._write_ids import new_write_id
from ._writes import create_write, update_write
from .base import WRITE_ID, Changes, Version
from .continued import Then
from .firestore import FirestoreJobStore

__all__ = ["IDLE_EXIT_S", "BatchingFirestoreJobStore", "WriteBatcher"]


class BatchingFirestoreJobStore(FirestoreJobStore):
    """:class:`FirestoreJobStore` whose ``create`` and ``update`` share BatchWrite RPCs.

    The store ``exactly_once`` builds by default. Same documents, same
    semantics, one write at a time as seen by each caller; ``get`` and
    ``transact`` are the parent's. ``max_batch``, ``max_in_flight``,
    ``slow_in_flight``, ``slow_after_s``, ``long_wait_s``, ``gather_s``, ``linger_s`` and
    ``max_batch_bytes`` tune the :class:`WriteBatcher`;
    the defaults are the ones that measured best (``docs/benchmarks.md``).
    """

    def __init__(
        self,
        client: firestore.Client,
        collection: str,
        *,
        rpc_timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
        max_batch: int = 100,
        max_in_flight: int = 1,
        slow_in_flight: int = 4,
        slow_after_s: float = 0.005,
        long_wait_s: float = 0.001,
        gather_s: float = 0.002,
        linger_s: float = 0.0,
        max_batch_bytes: int = MAX_BATCH_WRITE_BYTES,
    ) -> None:
        super().__init__(
            client, collection, rpc_timeout_s=rpc_timeout_s, retry_deadline_s=retry_deadline_s
        )
        # What DocumentReference._document_path gives for a plain document id, made once.
        self._prefix = "/".join((client._database_string, "documents", *self._collection._path))
        self.batcher = WriteBatcher(
            client,
            rpc_timeout_s=rpc_timeout_s,
            max_batch=max_batch,
            max_in_flight=max_in_flight,
            slow_in_flight=slow_in_flight,
            slow_after_s=slow_after_s,
            long_wait_s=long_wait_s,
            gather_s=gather_s,
            linger_s=linger_s,
            max_batch_bytes=max_batch_bytes,
            idle_exit_s=IDLE_EXIT_S,  # this module's, read when the store is built
        )

    def close(self) -> None:
        """Stop the flusher threads (after the queued writes)."""
        self.batcher.close()

    def _name(self, doc_id: str) -> str:
        """The full resource name of a job document (no reference made for a plain id)."""
        if not doc_id or "/" in doc_id:  # the client's own checks and errors
            return str(self.ref(doc_id)._document_path)
        return f"{self._prefix}/{doc_id}"

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        write_id = new_write_id()
        write = create_write(self._name(doc_id), {**fields, WRITE_ID: write_id})
        return self._settled_create(
            doc_id, write_id, lambda: self.batcher.submit(write, create=True)
        )

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        write_id, write = self._update_write(doc_id, changes, expected)
        return self._settled_update(doc_id, write_id, expected, lambda: self.batcher.submit(write))

    def _update_write(self, doc_id: str, changes: Changes, expected: Version) -> tuple[str, Any]:
        """A conditional update's write id and raw ``Write`` protobuf."""
        write_id = new_write_id()
        if not isinstance(expected, datetime.datetime):
            raise TypeError(f"not a version of this store: {expected!r}")
        data = {**changes, (WRITE_ID,): write_id}
        return write_id, update_write(self._name(doc_id), data, expected)

    def update_then(self, doc_id: str, changes: Changes, *, expected: Version, then: Then) -> None:
        """``update``, its outcome handed to ``then`` (:class:`~.continued.ContinuedStore`).

        An applied write calls ``then(version, None)`` on the thread that sent
        it, or a flusher if that thread was another caller's. Any other outcome
        calls ``then(None, settle)``: ``settle`` goes on as ``update`` would
        from that first attempt (reads back a write whose outcome is unknown,
        sends it again if it did not land, retries transient errors), on
        whatever thread calls it.
        """
        write_id, write = self._update_write(doc_id, changes, expected)

        def settled(sent: QueuedWrite) -> None:
            first = sent.error
            if first is None:
                then(sent.version, None)
                return
            tried = False

            def send() -> Version:
                nonlocal tried
                if not tried:  # the first attempt is the one already made
                    tried = True
                    raise first
                return self.batcher.submit(write)

            then(None, lambda: self._settled_update(doc_id, write_id, expected, send))

        self.batcher.submit_then(write, settled)
