"""A small, varied set of jobs like the attachment worker's, in the stored layout.

What the browser tests and the screenshots look at: completed jobs with their
steps and sent outbox entries, two running jobs, a released one, and failed
ones of three reasons (one with an outbox entry left unsent), plus older
completed ones enough for more than a page.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from benchmarks.ui_support import Job, job_document, write_documents
from pubsub_worker.stores.base import Status

__all__ = ["FAILED", "RUNNING", "SHOWCASE_COUNTS", "SHOWCASE_SUB", "seed_showcase"]

SHOWCASE_SUB = "projects/pubsub-worker-test/subscriptions/ui-attachments"
"""The subscription the tests seed the showcase for."""

_STEPS = [("parse", 96), ("transcode", 2410), ("store", 212)]
_OUT = "projects/attachment-demo/topics/attachments-transcoded"
RUNNING = ("op-2013", "op-2014")
FAILED = {
    "op-2006": "permanent",
    "op-2016": "attempts",
    "op-2017": "attempts",
    "op-2018": "too_large",
}
OLDER = 130
"""Completed jobs written days ago, past the first page."""
SHOWCASE_COUNTS = {
    Status.COMPLETED: 9 + OLDER,
    Status.RUNNING: len(RUNNING),
    Status.RELEASED: 1,
    Status.FAILED: len(FAILED),
}


def _attachment(op: str) -> tuple[bytes, dict[str, str]]:
    data = json.dumps({"claim_id": "C-" + op[-2:], "filename": f"scan-{op[-2:]}.raw"}).encode()
    return data, {"operation_id": op, "claim_id": "C-" + op[-2:], "source": "claims-portal"}


def showcase_jobs(now: datetime) -> list[Job]:
    """The jobs, newest last written last."""
    minute = timedelta(minutes=1)
    jobs = [
        Job(
            f"op-20{n:02d}",
            Status.COMPLETED,
            now - (40 - 3 * n) * minute,
            _STEPS,
            outbox=[("store", _OUT, True)],
            message_id=str(1000 + n),
            age_s=48,
        )
        for n in (1, 2, 3, 4, 5, 7, 8, 9, 10)
    ]
    jobs += [
        Job(
            "op-2006",
            Status.FAILED,
            now - 23 * minute,
            (),
            reason="permanent",
            error="PermanentError: attachment content is not base64: Incorrect padding",
            data=b'{"claim_id": "C-46", "filename": "x.raw", "content_b64": "%%%"}',
            attributes={"operation_id": "op-2006", "claim_id": "C-46"},
            message_id="1006",
            review="sent",
        ),
        Job(
            "op-2015",
            Status.RELEASED,
            now - 9 * minute,
            _STEPS[:2],
            error="ConnectionError: transcoder closed the connection",
            attempts=2,
            epoch=2,
            message_id="1015",
            age_s=300,
        ),
    ]
    for n, (reason, error, attempts, steps, outbox) in enumerate(
        [
            (
                "attempts",
                "attempt 5 failed: TimeoutError: transcoder did not answer in 30 s",
                5,
                _STEPS[:1],
                [],
            ),
            (
                "attempts",
                "attempt 5 failed: OSError: [Errno 28] No space left on device",
                5,
                _STEPS[:2],
                [("transcode", _OUT, False)],
            ),
            (
                "too_large",
                "DocumentTooLarge: step 'transcode' result is 312 KiB, over 256 KiB",
                1,
                _STEPS[:1],
                [],
            ),
        ],
        start=16,
    ):
        data, attributes = _attachment(f"op-20{n}")
        jobs.append(
            Job(
                f"op-20{n}",
                Status.FAILED,
                now - (20 - n) * minute,
                steps,
                outbox=outbox,
                reason=reason,
                error=error,
                attempts=attempts,
                epoch=attempts,
                data=data,
                attributes=attributes,
                message_id=str(1000 + n),
                review="sent",
                age_s=600,
            )
        )
    jobs += [
        Job(
            key,
            Status.RUNNING,
            now - n * timedelta(seconds=4),
            _STEPS[: 2 - n],
            message_id=key[-4:],
            age_s=70,
        )
        for n, key in enumerate(RUNNING)
    ]
    jobs += [
        Job(
            f"op-1{n:03d}",
            Status.COMPLETED,
            now - timedelta(days=2, minutes=n),
            _STEPS,
            outbox=[("store", _OUT, True)],
            message_id=str(n),
        )
        for n in range(OLDER)
    ]
    return jobs


def seed_showcase(client: Any, collection: str, subscription: str) -> dict[str, str]:
    """Write the showcase jobs; their document ids by key."""
    documents = [
        job_document(subscription, job) for job in showcase_jobs(datetime.now(timezone.utc))
    ]
    write_documents(client, collection, documents)
    return {fields["key"]: doc_id for doc_id, fields in documents}
