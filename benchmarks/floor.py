"""The least Python a one-step exactly-once delivery runs (``inprocess --floor``).

:class:`FloorDelivery` does a delivery's work and nothing else, in one
method: the job's key read and checked, its document id, payload and ack
digests (the library's own functions), the delivery made the latest of its
message and the key held in this process (two dictionaries under one lock),
the claim written (the same fields the library writes, through the same
store), the step run and checked still owned, the completion written (the
same field paths), the ack sent with a callback for its answer, two counts,
the key and the delivery given up. What it leaves out is the library's
structure around that work: the objects a delivery builds, its decisions
(the outcome of every path but the one taken), its logger, trace, metrics'
histograms, lease keeper and hooks, and every rare path (a busy job, a lost
or superseded delivery, a failed write, the failure path, the outbox,
ordering keys, a held message). It is not a worker: it is what
``python -m benchmarks.inprocess --floor`` times beside the library on the
same messages and the same in-memory store, so that the library's own
Python per message reads against the work it does (``docs/benchmarks-history.md``, ninth pass).
``tests/unit/test_bench_floor.py`` checks that it writes what the library
writes.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from datetime import datetime, timedelta, timezone
from typing import Any

from pubsub_worker._delivery.generations import ack_digest
from pubsub_worker._job.keys import document_id, payload_digest
from pubsub_worker._support.text import display
from pubsub_worker.stores.base import JobStore, shard_of

__all__ = ["FloorDelivery", "run_floor"]

_LEASE = timedelta(seconds=60)
_RETENTION = timedelta(days=30)


class FloorDelivery:
    """A one-step handler's delivery, its work only (see the module's doc)."""

    def __init__(self, store: JobStore, *, subscription: str, key_attribute: str) -> None:
        self._store = store
        self._subscription = subscription
        self._key_attribute = key_attribute
        self._owner = f"floor/{threading.get_native_id()}"
        self._lock = threading.Lock()  # guards everything below
        self._latest: dict[str, int] = {}  # message id -> its latest delivery's generation
        self._held: set[str] = set()  # the job documents whose key a delivery holds
        self._generation = 0
        self.received = 0
        self.completed = 0

    def __call__(self, message: Any) -> None:
        received_at = time.monotonic()
        if not message.exactly_once_enabled:
            raise RuntimeError("the subscription has no exactly-once delivery")
        key = message.attributes.get(self._key_attribute)
        if not key:
            raise ValueError("the key attribute is missing or empty")
        doc_id = document_id(self._subscription, key)
        delivery = ack_digest(message.ack_id)
        message_id = message.message_id
        with self._lock:
            self.received += 1
            self._generation += 1
            mine = self._generation
            self._latest[message_id] = mine
            if doc_id in self._held:
                raise RuntimeError("another delivery holds the key")
            self._held.add(doc_id)
        try:
            now = datetime.now(timezone.utc)
            version = self._store.create(
                doc_id,
                {
                    "key": display(key),
                    "subscription": self._subscription,
                    "shard": shard_of(doc_id),
                    "status": "running",
                    "epoch": 1,
                    "owner": self._owner,
                    "message_id": message_id,
                    "delivery": delivery,
                    "lease_seconds": _LEASE.total_seconds(),
                    "lease_expires_at": now + _LEASE,
                    "attempts": 1,
                    "payload_sha256": payload_digest(message.data),
                    "first_seen_at": now,
                    "updated_at": now,
                    "expire_at": now + _RETENTION,
                },
            )
            if self._latest.get(message_id) != mine or time.monotonic() - received_at > 600:
                raise RuntimeError("the delivery lost its job")
            result = json.dumps(1)  # the step: ``lambda: 1``, its result recorded as JSON
            at = datetime.now(timezone.utc)
            self._store.update(
                doc_id,
                {
                    ("steps", "one"): {"result": result, "epoch": 1, "at": at},
                    ("lease_expires_at",): None,
                    ("updated_at",): at,
                    ("status",): "completed",
                    ("completed_at",): at,
                    ("expire_at",): at + _RETENTION,
                },
                expected=version,
            )
            if self._latest.get(message_id) == mine:
                message.ack_with_response().add_done_callback(_answered)
            with self._lock:
                self.completed += 1
        finally:
            with self._lock:
                if self._latest.get(message_id) == mine:
                    del self._latest[message_id]
                self._held.discard(doc_id)


def _answered(future: Future[Any]) -> None:
    future.exception()  # the library reads the ack's answer; so does the floor


def run_floor(
    store: JobStore, messages: list[Any], *, subscription: str, key_attribute: str
) -> float:
    """CPU seconds per message for :class:`FloorDelivery` over ``messages``, each acked."""
    deliver = FloorDelivery(store, subscription=subscription, key_attribute=key_attribute)
    started = time.process_time()
    for message in messages:
        deliver(message)
    spent = time.process_time() - started
    if deliver.completed != len(messages):
        raise AssertionError("a delivery did not complete")
    return spent / max(len(messages), 1)
