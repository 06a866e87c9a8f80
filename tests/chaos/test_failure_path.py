"""The reviewed failure path, with a real worker process: bounded attempts, then review.

A job that keeps failing is claimed ``MAX_ATTEMPTS`` times, then its
original message goes to the failure topic once, its job document is
recorded ``failed``, and the message is acked: it is neither retried forever
nor lost. ``PermanentError`` takes the same path on the first attempt.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.chaos.conftest import BOTH_FLAVOURS
from tests.support.observe import acks, collect, deliveries, job_document, nacks, number
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

REVIEW_QUIET_S = 1.0
"""How long the failure subscription is read after the ack, to see that one message came."""


def attempts(effects: Effects) -> list[tuple[int, int]]:
    """``(attempt, epoch)`` of every run of the callback."""
    return [(number(e, "attempt"), number(e, "epoch")) for e in effects.read()]


@pytest.mark.parametrize(
    ("scenario", "reason", "expected_attempts"),
    [
        pytest.param("always_fail", "attempts", 3, id="always-raises-3-attempts"),
        pytest.param("permanent", "permanent", 1, id="permanent-error-1-attempt"),
    ],
)
@BOTH_FLAVOURS
def test_failing_job_goes_to_the_failure_topic_once_and_is_acked(
    scenario: str,
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
    """Failure window: a callback that raises on every attempt, or raises ``PermanentError``.

    ``always_fail`` raises a plain exception: each of the first two attempts is
    released (counted) and nacked, the third goes to review (reason
    ``attempts``). ``permanent`` raises ``PermanentError``: review on the first
    attempt (reason ``permanent``). Either way: exactly that many runs, one
    message on the failure topic with the original data and attributes plus
    the reason, the job document ``failed``, the original message acked.
    """
    review = make_subscription(exactly_once=False)  # the failure topic, and a way to read it
    env = {
        **worker_env,
        "CHAOS_SCENARIO": scenario,
        "PUBSUB_WORKER_MAX_ATTEMPTS": "3",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = workers(env, scenario)
    message_id = publisher.publish(
        eod_subscription.topic_path, b"payload", op="op-1", origin="chaos-test"
    ).result()
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    worker.kill()
    reviewed = collect(
        subscriber, review.subscription_path, until=time.monotonic() + REVIEW_QUIET_S, at_least=1
    )

    assert attempts(effects) == [(n, n) for n in range(1, expected_attempts + 1)]
    assert deliveries(worker, message_id) == expected_attempts
    assert nacks(worker, message_id) == expected_attempts - 1
    assert acks(worker, message_id) == ["SUCCESS"]

    assert len(reviewed) == 1
    failed = reviewed[0]
    assert failed.data == b"payload"
    attributes = dict(failed.attributes)
    assert {k: attributes[k] for k in ("op", "origin")} == {"op": "op-1", "origin": "chaos-test"}
    assert attributes["pubsub_worker_reason"] == reason
    assert attributes["pubsub_worker_attempts"] == str(expected_attempts)
    assert attributes["pubsub_worker_key"] == "op-1"
    assert attributes["pubsub_worker_message_id"] == message_id

    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, "op-1"
    )
    assert doc["status"] == "failed"
    assert doc["reason"] == reason
    assert doc["attempts"] == expected_attempts
    assert doc["epoch"] == expected_attempts
    assert doc["data"] == b"payload"
    assert not doc.get("steps")
