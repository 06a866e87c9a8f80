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

from emulator import Emulators, SubscriptionHandle, TcpProxy
from tests.chaos.conftest import BOTH_FLAVOURS, LEASE_S
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    collect,
    deliveries,
    end_stale_streams,
    job_document,
    nacks,
    number,
    runs,
    step_epochs,
    wait_until_let_go,
)
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
    assert doc["review"] == "sent"
    assert doc["reason"] == reason
    assert doc["attempts"] == expected_attempts
    assert doc["epoch"] == expected_attempts
    assert doc["data"] == b"payload"
    assert not doc.get("steps")


def test_an_owner_paused_before_its_failed_record_sends_no_failure_message(
    emulators: Emulators,
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
    """Crash window of the failure path (the window the protocol's model found).

    The owner's handler raises ``PermanentError`` at epoch 1; its failure path
    confirms ownership (step ``a``'s record rides on that write), and the
    worker is frozen (SIGSTOP) before it records the job failed, past its lease.
    A second worker takes the job over at epoch 2, skips ``a`` and completes.
    Woken up, the first worker's failed record is refused: it publishes no
    failure message for the job another owner completed (the old order,
    publish then record, sent one).
    """
    review = make_subscription(exactly_once=False)
    sub_path = eod_subscription.subscription_path
    common = {
        **worker_env,
        "CHAOS_SCENARIO": "permanent_first",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    with TcpProxy(emulators.pubsub_host or "") as pubsub_link:
        env = {
            **common,
            "PUBSUB_EMULATOR_HOST": pubsub_link.address,
            "CHAOS_GATES": "before_review",
        }
        stalled = workers(env, "stalled")
        message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "before_review")
        assert gate.wait_arrived() == stalled.pid  # ownership confirmed; nothing recorded yet
        stalled.pause()
        gate.release()  # takes effect when the process is resumed
        pubsub_link.cut()
        end_stale_streams(subscriber, sub_path)

        rescuer = workers(common, "rescuer")
        rescuer.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)

        stalled.resume()
        wait_until_let_go(stalled, message_id)
        stalled.kill()
        rescuer.kill()
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + 2.0)

    assert reviewed == []
    assert runs(effects, "a") == [(stalled.pid, 1)]
    assert runs(effects, "raise") == [(stalled.pid, 1)]
    assert runs(effects, "b") == [(rescuer.pid, 2)]
    assert "sent to the failure path" not in stalled.log()
    assert acks(stalled, message_id) == []
    assert acks(rescuer, message_id) == ["SUCCESS"]
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc.get("review")) == ("completed", 2, None)
    assert step_epochs(doc) == {"a": 1, "b": 2}
    taken_over_after = doc["steps"]["b"]["at"] - doc["steps"]["a"]["at"]
    assert taken_over_after.total_seconds() > LEASE_S


def test_a_failure_message_cut_off_after_the_failed_record_is_sent_by_the_redelivery(
    emulators: Emulators,
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
    """Crash window: the owner's link to Pub/Sub goes dark after its failed record is written.

    Its publish of the failure message times out, so the message is not acked
    and the worker is then killed. The redelivery, in a second worker, finds
    the job failed with its review pending: it publishes the failure message,
    marks it sent and acks, without running the handler again. Exactly one
    failure message, one run.
    """
    review = make_subscription(exactly_once=False)
    sub_path = eod_subscription.subscription_path
    common = {
        **worker_env,
        "CHAOS_SCENARIO": "permanent",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
        "PUBSUB_WORKER_ACK_TIMEOUT_SECONDS": "3",
    }
    with TcpProxy(emulators.pubsub_host or "") as pubsub_link:
        env = {
            **common,
            "PUBSUB_EMULATOR_HOST": pubsub_link.address,
            "CHAOS_GATES": "before_review",
        }
        owner = workers(env, "owner")
        message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "before_review")
        assert gate.wait_arrived() == owner.pid
        pubsub_link.blackhole()  # the failed record still lands: Firestore is reachable
        gate.release()
        owner.wait_for_log("failure path failed; the message comes back", timeout_s=30)
        owner.kill()
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["review"]) == ("failed", "pending")
    end_stale_streams(subscriber, sub_path)

    rescuer = workers(common, "rescuer")
    rescuer.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=90)
    rescuer.kill()
    reviewed = collect(
        subscriber, review.subscription_path, until=time.monotonic() + REVIEW_QUIET_S, at_least=1
    )

    assert len(reviewed) == 1
    attributes = dict(reviewed[0].attributes)
    assert (attributes["pubsub_worker_reason"], attributes["pubsub_worker_attempts"]) == (
        "permanent",
        "1",
    )
    assert attributes["pubsub_worker_message_id"] == message_id
    assert reviewed[0].data == b"payload"
    assert attempts(effects) == [(1, 1)]  # the handler ran once, in the owner
    assert "published the failed job's pending failure message" in rescuer.log()
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["review"], doc["epoch"], doc["attempts"]) == ("failed", "sent", 1, 1)
