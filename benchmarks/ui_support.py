"""What the dashboard's benchmark, browser tests and screenshots share: jobs and a server.

:func:`job_document` builds one document as a worker leaves it (the fields of
:mod:`pubsub_worker.stores.base`, the id a worker derives from the key, the
shard); :func:`seed_jobs` writes many of them in batches of 500 with
progress, a deterministic mix of statuses and failure reasons spread over a
week of last writes. The benchmark of the dashboard (:mod:`benchmarks.ui`),
its browser tests and its screenshots (``tests/ui``) seed with these; a
replay test uses a real worker instead. :func:`serving` runs an ASGI app
under uvicorn in a thread, on a free loopback port.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from pubsub_worker._job.keys import document_id
from pubsub_worker.stores import base as s

__all__ = ["Job", "job_document", "seed_jobs", "serving", "write_documents"]

BATCH = 500
"""Writes per batch commit (Firestore's limit)."""


@dataclass(frozen=True)
class Job:
    """What a seeded job looks like; everything else follows from its status."""

    key: str
    status: s.Status
    updated_at: datetime
    steps: Sequence[tuple[str, int]] = ()
    """(name, result bytes) of each recorded step, in order."""
    outbox: Sequence[tuple[str, str, bool]] = ()
    """(step, topic, sent) of each outbox entry."""
    reason: str | None = None
    error: str | None = None
    attempts: int = 1
    epoch: int = 1
    data: bytes | None = b"{}"
    attributes: Mapping[str, str] = field(default_factory=dict)
    lease_s: float = 60.0
    owner: str = "worker-7f9c/4312/a1b2c3d4"
    message_id: str = "0"
    review: str | None = None
    age_s: float = 0.0
    """How long before ``updated_at`` the job was first seen."""


def job_document(subscription: str, job: Job) -> tuple[str, dict[str, Any]]:
    """``(doc_id, fields)`` of ``job`` as the worker stores it."""
    doc_id = document_id(subscription, job.key)
    at = job.updated_at
    steps = {}
    for index, (name, size) in enumerate(job.steps):
        result = json.dumps("x" * max(size - 2, 0))
        step_at = at - timedelta(seconds=2.0 * (len(job.steps) - index))
        steps[name] = {"result": result, "epoch": job.epoch, "at": step_at}
    outbox = {}
    for index, (step, topic, sent) in enumerate(job.outbox):
        entry_id = hashlib.sha256(f"{job.key}:{step}:{index}".encode()).hexdigest()[:32]
        outbox[entry_id] = {
            "topic": topic,
            "data": json.dumps({"key": job.key, "step": step}).encode(),
            "attributes": {"effect_key": f"{job.key}:{step}:{index}"},
            "step": step,
            "effect_key": f"{job.key}:{step}:{index}",
            "sent": sent,
        }
    fields: dict[str, Any] = {
        s.KEY: job.key,
        s.SUBSCRIPTION: subscription,
        s.SHARD: s.shard_of(doc_id),
        s.STATUS: job.status.value,
        s.EPOCH: job.epoch,
        s.OWNER: job.owner,
        s.MESSAGE_ID: job.message_id,
        s.DELIVERY: hashlib.sha256(job.message_id.encode()).hexdigest()[:16],
        s.LEASE_SECONDS: job.lease_s,
        s.LEASE_EXPIRES_AT: at + timedelta(seconds=job.lease_s)
        if job.status is s.Status.RUNNING
        else None,
        s.ATTEMPTS: job.attempts,
        s.PAYLOAD_SHA256: hashlib.sha256(job.data or b"").hexdigest(),
        s.STEPS: steps,
        s.OUTBOX: outbox,
        s.FIRST_SEEN_AT: at - timedelta(seconds=job.age_s),
        s.UPDATED_AT: at,
        s.EXPIRE_AT: at + timedelta(days=30),
    }
    if job.status is s.Status.COMPLETED:
        fields[s.COMPLETED_AT] = at
    if job.error is not None:
        fields[s.ERROR] = job.error
    if job.status is s.Status.FAILED:
        fields.update(
            {
                s.REASON: job.reason or "error",
                s.FAILED_AT: at,
                s.DATA: job.data,
                s.ATTRIBUTES: json.dumps(dict(job.attributes)),
            }
        )
        if job.review is not None:
            fields[s.REVIEW] = job.review
    return doc_id, fields


def write_documents(
    client: Any,
    collection: str,
    documents: Sequence[tuple[str, dict[str, Any]]],
    progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> None:
    """Write ``documents`` (set: created or replaced) in batches of :data:`BATCH`."""
    ref = client.collection(collection)
    for start in range(0, len(documents), BATCH):
        batch = client.batch()
        for doc_id, fields in documents[start : start + BATCH]:
            batch.set(ref.document(doc_id), fields)
        batch.commit()
        progress(min(start + BATCH, len(documents)), len(documents))


_REASONS = ("attempts", "permanent", "attempts", "too_large", "permanent", "limits")
_ERRORS = {
    "attempts": "attempt 5 failed: TimeoutError: transcoder did not answer in 30 s",
    "permanent": "PermanentError: attachment content is not base64: Incorrect padding",
    "too_large": "DocumentTooLarge: step 'transcode' result is 300 KiB, over 256 KiB",
    "limits": "LimitExceeded: attribute value of 'note' is 1,500 bytes, over 1,024",
}


def bulk_job(index: int, now: datetime, rng: random.Random) -> Job:
    """The ``index``-th job of a big collection: 90% completed, 5% failed, 3% released,
    2% running; last writes spread over a week (running ones within a lease)."""
    roll = rng.random()
    key = f"op-{index:07d}"
    steps = [("parse", 120), ("transcode", rng.randint(200, 4000)), ("store", 180)]
    if roll < 0.02:
        return Job(key, s.Status.RUNNING, now - timedelta(seconds=rng.uniform(0, 30)), steps[:1])
    at = now - timedelta(seconds=rng.uniform(60, 7 * 86400))
    if roll < 0.05:
        return Job(
            key, s.Status.RELEASED, at, steps[:2], error="ConnectionError: reset", attempts=2
        )
    if roll < 0.10:
        reason = _REASONS[index % len(_REASONS)]
        return Job(
            key,
            s.Status.FAILED,
            at,
            steps[:1],
            reason=reason,
            error=_ERRORS[reason],
            attempts=5 if reason == "attempts" else 1,
            attributes={"operation_id": key},
            review="sent",
        )
    return Job(key, s.Status.COMPLETED, at, steps, outbox=[("store", "transcoded", True)])


def seed_jobs(
    client: Any,
    collection: str,
    subscription: str,
    count: int,
    *,
    seed: int = 7,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Write ``count`` jobs of :func:`bulk_job` for ``subscription``, with progress."""
    now = now or datetime.now(timezone.utc)
    rng = random.Random(seed)
    documents = [job_document(subscription, bulk_job(i, now, rng)) for i in range(count)]
    write_documents(client, collection, documents, progress or _print_progress)


def _print_progress(done: int, total: int) -> None:
    sys.stderr.write(f"\rseeding: {done:,}/{total:,} job documents ({100 * done // total}%)")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


@contextmanager
def serving(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """``app`` under uvicorn in a thread for the block; yields its base URL."""
    import uvicorn  # noqa: PLC0415 - the ui extra

    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ui-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
