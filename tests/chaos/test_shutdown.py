"""SIGTERM while a job runs: a graceful stop with real worker processes."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.chaos.conftest import LEASE_S
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    assert_not_redelivered,
    deliveries,
    end_stale_streams,
    job_document,
    nacks,
    runs,
    step_epochs,
)
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

STEP_S = 4
"""How long each step runs."""
GRACE_S = 6
"""``SHUTDOWN_GRACE_SECONDS``: step a ends 2 s before it, step b 2 s after it."""


def test_sigterm_mid_job_finishes_the_step_releases_the_job_and_exits_0(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Shutdown window: SIGTERM arrives while step a of a job runs (each step takes 4 s).

    ``run()`` stops pulling at once and gives the job the grace period (6 s):
    step a finishes inside it and step b starts; the grace period ends while b
    runs; b is not interrupted, but the job stops at the next step boundary
    instead of starting c. The job is released with a and b recorded and the
    attempt given back, the message is nacked (never acked), the process exits
    0. A message published after the signal is not taken. A worker started
    later completes the job: a and b are not run again, c runs once, and the
    job counts one attempt.
    """
    sub_path = eod_subscription.subscription_path
    env = {
        **worker_env,
        "CHAOS_STEP_SLEEP_S": str(STEP_S),
        "CHAOS_GATES": "step:a",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
    }
    first = workers(env, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    gate = Gate(effects.path, "step:a")
    gate.wait_arrived()
    first.process.send_signal(signal.SIGTERM)
    first.wait_for_log(f"in flight get {GRACE_S} s")  # the grace period starts now
    gate.release()  # a: 0-4 s (inside the grace), b: 4-8 s (the grace ends at 6 s)
    effects.wait_until("a", 1, timeout_s=10)
    # Its stream was closed on the signal, but the emulator may keep serving it (see
    # tests.support.observe): end it, or it would swallow the messages below for a lease.
    end_stale_streams(subscriber, sub_path)
    later_id = publisher.publish(eod_subscription.topic_path, b"later", op="op-2").result()
    assert first.process.wait(timeout=30) == 0

    assert runs(effects, "a") == runs(effects, "b") == [(first.pid, 1)]
    assert runs(effects, "c") == []
    assert deliveries(first, message_id) == 1
    assert deliveries(first, later_id) == 0  # it stopped pulling on the signal
    assert nacks(first, message_id) == 1
    assert acks(first, message_id) == []
    assert "completed (attempt" not in first.log()
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("released", 1, 0)
    assert step_epochs(doc) == {"a": 1, "b": 1}

    second = workers(worker_env, "second")
    for done_id in (message_id, later_id):
        second.wait_for_log(f"ack of message {done_id}: SUCCESS", timeout_s=30)
    second.kill()

    assert f"job op-1 message {message_id}: completed (attempt 1, epoch 2)" in second.log()
    assert f"job op-2 message {later_id}: completed (attempt 1, epoch 1)" in second.log()
    assert runs(effects, "a", "op-1") == runs(effects, "b", "op-1") == [(first.pid, 1)]
    assert runs(effects, "c", "op-1") == [(second.pid, 2)]
    assert [runs(effects, step, "op-2") for step in "abc"] == [[(second.pid, 1)]] * 3
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 1)
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 2}


def test_sigterm_while_a_completion_waits_for_its_ack_sends_the_ack_before_the_stream_closes(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Shutdown window: the handler returned, its completion is durable, its ack not sent.

    That conclusion runs on the completer, the callback thread already free.
    SIGTERM then: ``run()`` drains the completer before it closes the
    subscriber's stream, so the ack goes out on the open stream and is
    answered; the message is acked once, never redelivered, the job ran once.
    """
    sub_path = eod_subscription.subscription_path
    env = {**worker_env, "CHAOS_GATES": "before_ack", "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "10"}
    worker = workers(env, "worker")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    gate = Gate(effects.path, "before_ack")
    assert gate.wait_arrived() == worker.pid
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert doc["status"] == "completed"  # durable before the ack, as always
    worker.process.send_signal(signal.SIGTERM)
    worker.wait_for_log("in flight get 10 s")
    gate.release()
    assert worker.process.wait(timeout=30) == 0

    assert acks(worker, message_id) == ["SUCCESS"]
    assert nacks(worker, message_id) == 0
    assert [runs(effects, step) for step in "abc"] == [[(worker.pid, 1)]] * 3
    assert_not_redelivered(subscriber, sub_path, lease_s=LEASE_S)
