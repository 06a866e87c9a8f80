"""Keys are data: hostile effect keys through a real worker process, exact counts.

A key is whatever a publisher put in the key attribute. Each key below is
one that has broken real systems: path syntax (``a/b``, ``..``, ``__x__``,
reserved in Firestore document ids), %-format syntax (a logging error when
it reaches a format string), a newline (a forged line in a text log),
control characters and line separators, and the longest value Pub/Sub
allows. Each job must run its steps once and be acked once, and the worker's
JSON log must stay one object per line with no logging error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulator import SubscriptionHandle
from pubsub_worker._job.keys import display
from pubsub_worker._support import limits
from tests.support.observe import acks, job_document
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

# The longest key an attribute can hold in production (1024 bytes, multibyte characters
# included). A 2,000-byte key cannot be published there; the publisher fixture refuses it.
LONGEST = "long:" + "€" * 339 + "k" * 2
assert len(LONGEST.encode()) == limits.MAX_ATTRIBUTE_VALUE_BYTES

KEYS = [
    "a/b",
    "%s%d",
    "%(asctime)s",
    "x\nFORGED ERROR line",
    "..",
    "__x__",
    LONGEST,
    "ctl\x00\x01\x07\x1b[31m\x7f\r\t\x85\u2028\u202eend",
]


def test_hostile_keys_run_once_ack_once_and_log_one_json_object_per_line(
    publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    worker = workers(worker_env)
    ids = {
        key: publisher.publish(eod_subscription.topic_path, b"payload", op=key).result()
        for key in KEYS
    }
    for message_id in ids.values():
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)

    # Steps a, b, c once per key, recorded under the exact key.
    assert effects.by_effect() == {"a": len(KEYS), "b": len(KEYS), "c": len(KEYS)}
    for key in KEYS:
        assert [e["effect"] for e in effects.read() if e["key"] == key] == ["a", "b", "c"]
        doc = job_document(
            firestore_client, firestore_collection, eod_subscription.subscription_path, key
        )
        assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
        assert doc["key"] == display(key)
    for message_id in ids.values():
        assert acks(worker, message_id) == ["SUCCESS"]

    # Strict UTF-8, and every line (by "\n" and by every line break Python knows) is one
    # JSON object: no key ended a line early or started one of its own.
    raw = worker.log_path.read_bytes().decode("utf-8")
    assert "--- Logging error ---" not in raw
    lines = raw.rstrip("\n").split("\n")
    assert raw.splitlines() == lines
    entries = [json.loads(line) for line in lines]
    assert all(isinstance(entry, dict) for entry in entries)

    # The structured fields carry each key exactly, next to its message id.
    logged = {(e.get("job_key"), e.get("message_id")) for e in entries}
    for key, message_id in ids.items():
        assert (key, message_id) in logged
