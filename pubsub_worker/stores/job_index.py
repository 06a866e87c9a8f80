"""The listing index of one subscription's jobs, as ``jobs stats``, the dashboard and a
worker's start-up check (failed jobs waiting for their failure message) read it.

:class:`JobIndex` is what is asked of it: counts (of a status, last written
before a time, failed for a reason) and the newest documents.
:class:`FirestoreJobIndex` sends each as one query the listing indexes serve
(:mod:`pubsub_worker._ops.stats` shows them); :class:`MemoryJobIndex` gives
the same answers on the in-memory store by reading every document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.base_query import FieldFilter

from pubsub_worker.errors import StoreError

from . import base as s
from .base import Status
from .layout import IndexMissing, index_command, list_query_shape
from .memory import MemoryJobStore

__all__ = ["REVIEW_READS", "FirestoreJobIndex", "JobIndex", "MemoryJobIndex", "Row", "updated_at"]

REVIEW_READS = 100
"""Failed jobs, most recently written first, whose ``review`` field is read for the pending
reviews (``review`` is exempt from indexing, so they are not counted by a query)."""


@dataclass(frozen=True)
class Row:
    """One job document as a query returned it."""

    doc_id: str
    fields: Mapping[str, Any]
    read_time: datetime | None = None
    update_time: datetime | None = None


class JobIndex(Protocol):
    """The listing index of one subscription's jobs: what :func:`job_stats` reads.

    Both methods see only documents of the subscription that have a shard,
    ordered by ``updated_at``; ``before`` keeps those last written earlier.
    """

    subscription: str

    def count(
        self, status: Status, *, before: datetime | None = None, reason: str | None = None
    ) -> int:
        """How many jobs have ``status`` (last written before ``before``; failed for ``reason``)."""
        ...

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        """The ``limit`` most recently written of them, newest first (``fields`` only, if given)."""
        ...


def updated_at(row: Row) -> datetime | None:
    """The row's ``updated_at``, as an aware time (None when it has none)."""
    value = row.fields.get(s.UPDATED_AT)
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


class FirestoreJobIndex:
    """:class:`JobIndex` on a Firestore collection: the queries of the module docstring."""

    def __init__(self, client: Any, collection: str, subscription: str) -> None:
        self._client = client
        self._collection = collection
        self.subscription = subscription

    def _query(self, status: Status, before: datetime | None, reason: str | None = None) -> Any:
        query = (
            self._client.collection(self._collection)
            .where(filter=FieldFilter(s.SUBSCRIPTION, "==", self.subscription))
            .where(filter=FieldFilter(s.STATUS, "==", status.value))
        )
        if reason is not None:
            query = query.where(filter=FieldFilter(s.REASON, "==", reason))
        query = query.where(filter=FieldFilter(s.SHARD, "in", list(range(s.SHARDS))))
        if before is not None:
            query = query.where(filter=FieldFilter(s.UPDATED_AT, "<", before))
        return query

    def _failed(
        self, status: Status, before: datetime | None, exc: Exception, reason: str | None = None
    ) -> Exception:
        if isinstance(exc, gexc.FailedPrecondition):
            ranged, by_reason = before is not None, reason is not None
            shape = list_query_shape(status, older_than=ranged, reason=by_reason)
            return IndexMissing(index_command(self._collection, shape.index()), str(exc))
        return StoreError(f"counting the {status.value} jobs of {self.subscription} failed: {exc}")

    def count(
        self, status: Status, *, before: datetime | None = None, reason: str | None = None
    ) -> int:
        try:
            results = self._query(status, before, reason).count(alias="n").get()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise self._failed(status, before, exc, reason) from exc
        return int(results[0][0].value)

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        query = (
            self._query(status, before)
            .order_by(s.UPDATED_AT, direction="DESCENDING")
            .order_by("__name__", direction="DESCENDING")
            .limit(limit)
        )
        if fields is not None:
            query = query.select(list(fields))
        try:
            snapshots = list(query.stream())
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise self._failed(status, before, exc) from exc
        return [
            Row(snap.id, snap.to_dict() or {}, snap.read_time, snap.update_time)
            for snap in snapshots
        ]


class MemoryJobIndex:
    """:class:`JobIndex` on the in-memory store: the same answers, by reading every document."""

    def __init__(self, store: MemoryJobStore, subscription: str) -> None:
        self._store = store
        self.subscription = subscription

    def _rows(
        self, status: Status, before: datetime | None, reason: str | None = None
    ) -> list[Row]:
        rows = []
        for doc_id, snapshot in self._store.snapshots().items():
            fields = snapshot.fields
            row = Row(doc_id, fields, snapshot.read_time, snapshot.update_time)
            if (
                fields.get(s.SUBSCRIPTION) != self.subscription
                or fields.get(s.STATUS) != status.value
                or fields.get(s.SHARD) is None
                or (reason is not None and fields.get(s.REASON) != reason)
            ):
                continue
            updated = updated_at(row)
            if before is not None and (updated is None or updated >= before):
                continue
            rows.append(row)
        return rows

    def count(
        self, status: Status, *, before: datetime | None = None, reason: str | None = None
    ) -> int:
        return len(self._rows(status, before, reason))

    def newest(
        self,
        status: Status,
        *,
        before: datetime | None = None,
        limit: int = 1,
        fields: Sequence[str] | None = None,
    ) -> list[Row]:
        rows = [row for row in self._rows(status, before) if updated_at(row) is not None]
        rows.sort(key=lambda row: (updated_at(row), row.doc_id), reverse=True)
        if fields is not None:
            rows = [
                Row(
                    r.doc_id,
                    {f: r.fields[f] for f in fields if f in r.fields},
                    r.read_time,
                    r.update_time,
                )
                for r in rows
            ]
        return rows[:limit]
