"""The query every listing of jobs sends.

One Firestore query per listing (``jobs list``, the dashboard's pages)::

    where subscription == S [and status == X] [and reason == R]
          and shard in [0 .. SHARDS - 1] [and updated_at < now - AGE]
    order by updated_at desc, __name__ desc

Real Firestore answers it only from a composite index
(:func:`~pubsub_worker.stores.layout.list_query_shape` names it). Paged by
:func:`pubsub_worker._ops.jobs.list_jobs`; counted by
:class:`~pubsub_worker.stores.job_index.FirestoreJobIndex`, which sends the
same filters as a ``count()`` aggregation, answered from the same index.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from pubsub_worker._job.lease import now_utc
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Status

__all__ = ["listing_query"]


def listing_query(
    client: Any,
    collection: str,
    subscription: str,
    *,
    status: Status | None = None,
    reason: str | None = None,
    older_than_s: float | None = None,
    now: datetime | None = None,
) -> Any:
    """The query of a listing, without its limit and cursor.

    ``status`` and ``reason`` (a failed job's, with ``status`` failed) are
    equalities, ``older_than_s`` keeps jobs last written at least that long
    before ``now``. Newest first. Each shape has its
    composite index: :func:`~pubsub_worker.stores.layout.list_query_shape`.
    """
    query = client.collection(collection).where(
        filter=FieldFilter(s.SUBSCRIPTION, "==", subscription)
    )
    if status is not None:
        query = query.where(filter=FieldFilter(s.STATUS, "==", status.value))
    if reason is not None:
        query = query.where(filter=FieldFilter(s.REASON, "==", reason))
    query = query.where(filter=FieldFilter(s.SHARD, "in", list(range(s.SHARDS))))
    if older_than_s is not None:
        cutoff = (now or now_utc()) - timedelta(seconds=older_than_s)
        query = query.where(filter=FieldFilter(s.UPDATED_AT, "<", cutoff))
    return query.order_by(s.UPDATED_AT, direction="DESCENDING").order_by(
        "__name__", direction="DESCENDING"
    )
