"""Error texts that are not valid UTF-8, through a real worker process: escaped, never a loop.

A handler that names a file from ``os.fsdecode`` of non-UTF-8 bytes puts a
lone surrogate (``\\udcff``) in its error. Neither Firestore nor Pub/Sub
takes such text; the library escapes it where it writes the release record,
the failed record and the failure message, so the job takes its normal path
exactly once: ``PermanentError`` to review on the first attempt, a plain
error released (counted) until ``MAX_ATTEMPTS``, then review.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.support.observe import acks, collect, deliveries, job_document, nacks, number
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

ESCAPED = "report-\\udcff.csv"
"""``os.fsdecode(b"report-\\xff.csv")`` made valid UTF-8: the surrogate as visible text."""

REVIEW_QUIET_S = 1.0
"""How long the failure subscription is read after the ack, to see that one message came."""


@pytest.mark.parametrize(
    ("scenario", "error", "reason", "expected_attempts"),
    [
        pytest.param(
            "permanent_surrogate",
            f"PermanentError: bad file {ESCAPED}",
            "permanent",
            1,
            id="permanent-error-1-attempt",
        ),
        pytest.param(
            "fail_surrogate",
            f"RuntimeError: bad file {ESCAPED}",
            "attempts",
            3,
            id="plain-error-3-attempts",
        ),
    ],
)
def test_an_error_with_a_lone_surrogate_takes_the_normal_path_once_escaped(
    scenario: str,
    error: str,
    reason: str,
    expected_attempts: int,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Exactly ``expected_attempts`` runs (each earlier one released and nacked), one
    message on the failure topic carrying the escaped error, the job ``failed`` with the
    escaped error, the original message acked once."""
    review = make_subscription(exactly_once=False)
    env = {
        **worker_env,
        "CHAOS_SCENARIO": scenario,
        "PUBSUB_WORKER_MAX_ATTEMPTS": "3",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = workers(env, scenario)
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    worker.kill()
    reviewed = collect(
        subscriber, review.subscription_path, until=time.monotonic() + REVIEW_QUIET_S, at_least=1
    )

    runs = [(number(e, "attempt"), number(e, "epoch")) for e in effects.read()]
    assert runs == [(n, n) for n in range(1, expected_attempts + 1)]
    assert deliveries(worker, message_id) == expected_attempts
    assert nacks(worker, message_id) == expected_attempts - 1
    assert acks(worker, message_id) == ["SUCCESS"]
    assert "failure path failed" not in worker.log()

    assert len(reviewed) == 1
    attributes = dict(reviewed[0].attributes)
    assert attributes["pubsub_worker_reason"] == reason
    assert attributes["pubsub_worker_error"] == error
    assert attributes["pubsub_worker_attempts"] == str(expected_attempts)
    assert reviewed[0].data == b"payload"

    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, "op-1"
    )
    assert (doc["status"], doc["reason"], doc["error"]) == ("failed", reason, error)
    assert (doc["attempts"], doc["epoch"]) == (expected_attempts, expected_attempts)
