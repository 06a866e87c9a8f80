"""A sink that refuses writes from a job's former owner: the epoch as a fencing token.

A worker whose lease lapsed (a long GC pause, SIGSTOP, a network partition)
keeps running after another worker took its job over at a higher epoch.
Pass ``job.epoch`` with every write: the sink keeps, per resource, the
highest epoch it has accepted and rejects a lower one. The check and the
write are one Firestore transaction, so no write can slip in between.

What it guarantees, exactly: once a write at epoch N was accepted for a
resource, no write with an epoch below N lands on it. It does not make a
write happen once: a former owner that writes *before* the new owner is
accepted, then overwritten (the highest epoch wins). Where a repeat matters,
pair it with ``job.idempotency_key(step)``, or use ``job.transactional_step``
when the sink is in the same Firestore database as the jobs.

Stored layout, one document per resource::

    {collection}/{sha256(resource)}
      resource     str        the resource name, as given
      epoch        int        highest epoch accepted so far
      value        map        the value of the last accepted write
      updated_at   timestamp  when it was written
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from google.cloud import firestore

import pubsub_worker

__all__ = ["FencedSink", "StaleEpoch"]


class StaleEpoch(pubsub_worker.LostOwnership):
    """The sink accepted a newer epoch for this resource: the writer no longer owns its job.

    A subclass of :class:`pubsub_worker.LostOwnership`, so when it is raised from
    a step the wrapper stops the job without acking, as for any lost ownership.
    """

    def __init__(self, resource: str, epoch: int, seen: int) -> None:
        super().__init__(f"{resource!r}: write at epoch {epoch} refused, epoch {seen} was seen")
        self.resource = resource
        self.epoch = epoch
        self.seen = seen


class FencedSink:
    """Writes values per resource, refusing any epoch lower than the highest one seen."""

    def __init__(self, client: firestore.Client, collection: str) -> None:
        self._client = client
        self._collection = client.collection(collection)

    def write(self, resource: str, value: Mapping[str, Any], *, epoch: int) -> None:
        """Store ``value`` for ``resource`` unless a higher epoch was accepted before.

        The same epoch is accepted again (a step re-run by the same owner).
        Raises :class:`StaleEpoch` otherwise; nothing is written then.
        """
        ref = self._ref(resource)

        @firestore.transactional
        def check_and_write(transaction: firestore.Transaction) -> None:
            # Read inside the transaction: a concurrent writer makes one of us retry.
            snap = ref.get(transaction=transaction)
            seen = int(snap.get("epoch")) if snap.exists else 0
            if epoch < seen:
                raise StaleEpoch(resource, epoch, seen)
            transaction.set(
                ref,
                {
                    "resource": resource,
                    "epoch": epoch,
                    "value": dict(value),
                    "updated_at": firestore.SERVER_TIMESTAMP,
                },
            )

        check_and_write(self._client.transaction())

    def read(self, resource: str) -> dict[str, Any] | None:
        """The stored document of ``resource`` (``epoch``, ``value``...), or ``None``."""
        snap = self._ref(resource).get()
        return snap.to_dict() if snap.exists else None

    def _ref(self, resource: str) -> firestore.DocumentReference:
        # Resource names are caller input: hash them into a valid document id
        # ("a/b" would address a sub-collection, "..", "__x__" are invalid ids).
        return self._collection.document(hashlib.sha256(resource.encode()).hexdigest())
