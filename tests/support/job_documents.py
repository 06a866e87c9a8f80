"""Job documents written as a worker leaves them, for tests of what the operator commands read."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pubsub_worker._job.keys import document_id
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobStore, Status


def put_job(store: JobStore, subscription: str, key: str, status: Status, **options: Any) -> str:
    """Create :func:`job_document` in ``store``; its id."""
    doc_id, fields = job_document(subscription, key, status, **options)
    store.create(doc_id, fields)
    return doc_id


def job_document(
    subscription: str,
    key: str,
    status: Status,
    *,
    updated_at: datetime | None = None,
    review: str | None = None,
    **more: Any,
) -> tuple[str, dict[str, Any]]:
    """``key``'s job document with ``status``, as a worker leaves it: its id and fields.

    ``updated_at`` is the last write's time (the writer's clock: now by default). A
    failed one carries what a replay publishes.
    """
    doc_id = document_id(subscription, key)
    at = updated_at or datetime.now(timezone.utc)
    fields: dict[str, Any] = {
        s.KEY: key,
        s.SUBSCRIPTION: subscription,
        s.STATUS: status.value,
        s.EPOCH: 1,
        s.OWNER: "host/4242/cafe",
        s.MESSAGE_ID: f"m-{key}",
        s.ATTEMPTS: 1,
        s.LEASE_SECONDS: 600.0,
        s.FIRST_SEEN_AT: at,
        s.UPDATED_AT: at,
        s.SHARD: s.shard_of(doc_id),
    }
    if status is Status.FAILED:
        fields.update(
            {
                s.FAILED_AT: at,
                s.REASON: "permanent",
                s.ERROR: "PermanentError: downstream said no",
                s.DATA: b"doc-" + key.encode(),
                s.ATTRIBUTES: json.dumps({"op": key}),
            }
        )
    if review is not None:
        fields[s.REVIEW] = review
    fields.update(more)
    return doc_id, fields
