"""A job core concludes once: after its completion or failure, no other conclusion writes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import pytest

from pubsub_worker._delivery.generations import DeliveryTracker
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.context import JobContext
from pubsub_worker._job.core import JobCore
from pubsub_worker._job.keys import derive_identity
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores.base import Status

SUB = "projects/p/subscriptions/s"


def _publish(topic: str, data: bytes, attributes: Mapping[str, str]) -> Future[str]:
    raise AssertionError("nothing is published here")


def _core(store: MemoryJobStore) -> JobCore:
    """The owner's core of a freshly claimed job ``k``."""
    tracker = DeliveryTracker()
    delivery = tracker.register("m1", "ack-1")
    identity = derive_identity(
        subscription=SUB, message_id="m1", attributes={"op": "k"}, data=b"x", key_attribute="op"
    )
    got = claim(
        store,
        ClaimRequest(
            identity=identity,
            owner="me",
            message_id="m1",
            delivery=delivery.digest,
            lease_s=60,
            retention_s=3600,
            abandoned=tracker.abandoned,
        ),
    )
    assert got.kind is ClaimKind.CLAIMED
    assert got.record is not None
    assert got.version is not None
    context = JobContext(
        store=store,
        tracker=tracker,
        metrics=Metrics(),
        publish=_publish,
        topic_path=lambda topic: f"projects/p/topics/{topic}",
        lease_s=60,
        retention_s=3600,
        io_timeout_s=10.0,
        outbox_key_attribute="effect_key",
        stopping=threading.Event(),
        hooks=Hooks(),
    )
    return JobCore(
        identity=identity,
        delivery=delivery,
        record=got.record,
        version=got.version,
        context=context,
        log=job_logger(logging.getLogger("test"), "k", "m1"),
    )


def _status(store: MemoryJobStore, core: JobCore) -> str:
    snap = store.get(core.identity.doc_id)
    assert snap is not None
    return str(snap.fields["status"])


@pytest.mark.parametrize("first", ["complete", "fail"])
@pytest.mark.parametrize("then", ["release", "fail"])
def test_after_a_completion_or_a_failure_no_other_conclusion_is_written(
    first: str, then: str
) -> None:
    store = MemoryJobStore()
    core = _core(store)
    if first == "complete":
        core.complete()
    else:
        core.fail("permanent", "PermanentError: no", {})
    written = store.writes
    conclude: dict[str, Any] = {
        "release": lambda: core.release("late", count_attempt=True),
        "fail": lambda: core.fail("permanent", "PermanentError: late", {}),
    }
    with pytest.raises(RuntimeError, match="already"):
        conclude[then]()
    assert store.writes == written
    expected = Status.COMPLETED if first == "complete" else Status.FAILED
    assert _status(store, core) == expected.value
