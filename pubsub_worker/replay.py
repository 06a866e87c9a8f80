"""Review and replay of the failure path.

``list_failed`` reads the ``failed`` records of a subscription. ``replay``
revives them: each job record is first set back to ``released`` with its
attempts reset (conditioned on its version, so a concurrent change wins),
*then* the original message is published again with the same key. The
recorded steps stay, so the replayed job skips every step that already took
effect: replay repeats no effect. The reset comes first because a message
published before it would meet a ``failed`` record and be acked unprocessed;
a crash between the two leaves a ``released`` record marked ``replayed_at``,
which ``replay --key`` picks up again (a second publish is deduplicated by
the key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from google.cloud.firestore_v1.base_query import FieldFilter

from . import store as s
from .claim import now_utc
from .keys import REPLAY_OF_ATTRIBUTE
from .store import Status

__all__ = ["FailedJob", "ReplayResult", "list_failed", "replay"]

REPLAYED_AT = "replayed_at"


@dataclass(frozen=True)
class FailedJob:
    """A record in the failure path."""

    doc_id: str
    key: str | None
    reason: str | None
    error: str | None
    attempts: int
    failed_at: datetime | None
    message_id: str | None
    data: bytes | None
    attributes: dict[str, str]
    is_job: bool
    """False for a message rejected before it became a job (missing key, payload conflict)."""


@dataclass(frozen=True)
class ReplayResult:
    """What happened to one record."""

    job: FailedJob
    outcome: str
    """``replayed``, ``dry-run``, or ``skipped: <why>``."""


def _parse(snapshot: Any) -> FailedJob:
    fields = snapshot.to_dict() or {}
    raw_attributes = fields.get(s.ATTRIBUTES)
    attributes = json.loads(raw_attributes) if isinstance(raw_attributes, str) else {}
    return FailedJob(
        doc_id=snapshot.id,
        key=fields.get(s.KEY),
        reason=fields.get(s.REASON),
        error=fields.get(s.ERROR),
        attempts=int(fields.get(s.ATTEMPTS, 0)),
        failed_at=fields.get(s.FAILED_AT),
        message_id=fields.get(s.MESSAGE_ID),
        data=fields.get(s.DATA),
        attributes=attributes,
        is_job=int(fields.get(s.EPOCH, 0)) > 0,
    )


def list_failed(
    client: Any, collection: str, subscription: str, *, keys: Iterable[str] = ()
) -> Iterator[FailedJob]:
    """Failed records of ``subscription``; with ``keys``, those jobs if not completed."""
    wanted = list(keys)
    query = client.collection(collection).where(
        filter=FieldFilter(s.SUBSCRIPTION, "==", subscription)
    )
    if wanted:
        for key_chunk in _chunks(wanted, 10):
            for snapshot in query.where(filter=FieldFilter(s.KEY, "in", key_chunk)).stream():
                status = (snapshot.to_dict() or {}).get(s.STATUS)
                if status == Status.FAILED.value or (
                    status == Status.RELEASED.value and (snapshot.to_dict() or {}).get(REPLAYED_AT)
                ):
                    yield _parse(snapshot)
        return
    for snapshot in query.where(filter=FieldFilter(s.STATUS, "==", Status.FAILED.value)).stream():
        yield _parse(snapshot)


def replay(
    client: Any,
    collection: str,
    jobs: Iterable[FailedJob],
    *,
    topic: str,
    publish: Callable[[str, bytes, dict[str, str]], Any],
    key_attribute: str | None,
    dry_run: bool = False,
    progress: Callable[[int, ReplayResult], None] = lambda _i, _r: None,
    timeout_s: float = 60.0,
) -> list[ReplayResult]:
    """Reset each failed job and publish its original message to ``topic`` again."""
    results: list[ReplayResult] = []
    for index, job in enumerate(jobs, start=1):
        result = ReplayResult(
            job,
            _replay_one(client, collection, job, topic, publish, key_attribute, dry_run, timeout_s),
        )
        results.append(result)
        progress(index, result)
    return results


def _replay_one(
    client: Any,
    collection: str,
    job: FailedJob,
    topic: str,
    publish: Callable[[str, bytes, dict[str, str]], Any],
    key_attribute: str | None,
    dry_run: bool,
    timeout_s: float,
) -> str:
    if not job.is_job:
        return f"skipped: rejected before it became a job ({job.reason}); fix and republish"
    if job.data is None:
        return "skipped: payload too large to keep; republish it from the failure topic"
    if dry_run:
        return "dry-run"
    ref = client.collection(collection).document(job.doc_id)
    snapshot = ref.get()
    fields = snapshot.to_dict() or {}
    if fields.get(s.STATUS) == Status.COMPLETED.value:
        return "skipped: completed meanwhile"
    ref.update(
        {
            s.STATUS: Status.RELEASED.value,
            s.ATTEMPTS: 0,
            s.LEASE_EXPIRES_AT: None,
            REPLAYED_AT: now_utc(),
            s.UPDATED_AT: now_utc(),
        },
        option=client.write_option(last_update_time=snapshot.update_time),
    )
    attributes = dict(job.attributes)
    if key_attribute is None and job.key is not None:
        attributes[REPLAY_OF_ATTRIBUTE] = job.key
    publish(topic, job.data, attributes).result(timeout=timeout_s)
    return "replayed"


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
