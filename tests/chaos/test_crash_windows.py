"""Crash windows of the core, with real processes and exact effect counts.

Each test drives real worker processes (``tests/support/worker.py``, steps
``a``, ``b``, ``c``) against the real emulators and checks exactly: the
effects the step functions had (one JSON line each, with the pid and epoch
of the run), the job document (status, epoch, attempts, and the epoch that
recorded each step), and the Pub/Sub side: who was handed each delivery and
what Pub/Sub answered to each ack (with exactly-once delivery a ``SUCCESS``
is final), and, where the ack is the crash window, that nothing comes back
within a lease once the workers are gone. Before a rescuer starts, the stale
streams of killed workers are ended at the emulator
(:func:`~tests.support.observe.end_stale_streams`), so a redelivery comes one
lease after the crash instead of a random multiple of it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle, TcpProxy
from pubsub_worker._support import fences
from tests.chaos.conftest import BOTH_FLAVOURS, LEASE_S
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    assert_not_redelivered,
    deliveries,
    end_stale_streams,
    job_document,
    nacks,
    pids,
    runs,
    step_epochs,
    wait_until_let_go,
)
from tests.support.processes import Effects, Worker

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]


def kill(*workers: Worker) -> None:
    for worker in workers:
        worker.kill()


@BOTH_FLAVOURS
def test_sigkill_in_step_b_of_three_resumes_at_step_b(
    publisher: Any,
    subscriber: Any,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Crash window: SIGKILL inside step b. The redelivery skips a (recorded) and runs b, c."""
    first = workers({**worker_env, "CHAOS_KILL_AT": "step:b"}, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    first.process.wait(timeout=60)  # it killed itself inside step b
    assert effects.count("killed") == 1
    assert effects.count("a") == 1
    assert effects.count("b") == 0

    end_stale_streams(subscriber, eod_subscription.subscription_path)
    second = workers(worker_env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    assert effects.by_effect() == {"killed": 1, "a": 1, "b": 1, "c": 1}
    assert runs(effects, "b") == runs(effects, "c") == [(second.pid, 2)]
    assert acks(second, message_id) == ["SUCCESS"]


@BOTH_FLAVOURS
def test_callback_paused_past_its_lease_can_neither_commit_nor_ack(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Crash window: a worker frozen (SIGSTOP, as in a long GC pause) inside step b past its lease.

    The redelivery goes to a second worker, which takes the job over at epoch
    2 and completes it. When the frozen worker wakes up, its step function
    finishes (it was already running: a step's *function* runs at least once,
    the documented at-least-once window, hence two ``b`` effects), but its
    record of ``b`` is rejected (its conditional write finds the new owner's
    version) and it stops at that step boundary: no completion, no ack. What
    the design guarantees, and what is asserted exactly: each step is
    *recorded* once, by the owner of the epoch that ran it, and the job is
    completed once, by epoch 2.

    The commit's version precondition alone stops it: the frozen worker runs
    with its generation fence switched off, so the delivery its lease keeper
    gives up on waking (no progress for a lease) does not stop it first.
    Without the precondition its record lands and it completes again
    (``tests/integration/test_fences.py`` switches it off).
    """
    sub_path = eod_subscription.subscription_path
    with TcpProxy(emulators.pubsub_host or "") as pubsub_link:
        env = {
            **worker_env,
            "PUBSUB_EMULATOR_HOST": pubsub_link.address,
            "CHAOS_GATES": "step:b",
            fences.ENV: "generation",
        }
        stalled = workers(env, "stalled")
        message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "step:b")
        assert gate.wait_arrived() == stalled.pid  # step a is recorded; b has started
        stalled.pause()
        gate.release()  # takes effect when the process is resumed
        # While it is frozen its Pub/Sub connection drops, as it would in a long pause,
        # so the redelivery can only go to the rescuer (see tests.support.observe).
        pubsub_link.cut()
        end_stale_streams(subscriber, sub_path)

        rescuer = workers(worker_env, "rescuer")
        rescuer.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)

        stalled.resume()
        wait_until_let_go(stalled, message_id)
        kill(stalled, rescuer)

    assert runs(effects, "a") == [(stalled.pid, 1)]
    # b: the rescuer's run (recorded), then the woken worker's late run (discarded)
    assert runs(effects, "b") == [(rescuer.pid, 2), (stalled.pid, 1)]
    assert runs(effects, "c") == [(rescuer.pid, 2)]
    # Woken up, its record of b finds the rescuer's epoch: it stops there, once, with a nack
    # (its delivery counts as current: that fence is off), never with a completion.
    assert "fence(s) generation switched off" in stalled.log()
    assert stalled.log().count("ownership lost (the job was claimed at epoch 2 (ours: 1)); ") == 1
    assert stalled.log().count("completed (attempt") == 0
    assert "completed (attempt 2, epoch 2)" in rescuer.log()
    assert (deliveries(stalled, message_id), deliveries(rescuer, message_id)) == (1, 1)
    assert (acks(stalled, message_id), nacks(stalled, message_id)) == ([], 1)
    assert acks(rescuer, message_id) == ["SUCCESS"]

    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert doc["status"] == "completed"
    assert doc["epoch"] == 2
    assert doc["attempts"] == 2
    assert step_epochs(doc) == {"a": 1, "b": 2, "c": 2}
    # The rescuer took the job over only once the frozen owner's lease had lapsed.
    taken_over_after = doc["steps"]["b"]["at"] - doc["steps"]["a"]["at"]
    assert taken_over_after > timedelta(seconds=LEASE_S)
    assert_not_redelivered(subscriber, sub_path, lease_s=LEASE_S)


@BOTH_FLAVOURS
def test_sigkill_after_completion_before_ack_acks_without_running(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Crash window: the completion record is durable, the process dies before the ack.

    The redelivery finds the job ``completed`` and acks it without running any
    step: every step's effect happened exactly once, and the message is gone.
    """
    sub_path = eod_subscription.subscription_path
    first = workers({**worker_env, "CHAOS_KILL_AT": "before_ack"}, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    first.process.wait(timeout=60)
    assert effects.by_effect() == {"a": 1, "b": 1, "c": 1, "killed": 1}

    end_stale_streams(subscriber, sub_path)
    second = workers(worker_env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    kill(second)

    assert effects.by_effect() == {"a": 1, "b": 1, "c": 1, "killed": 1}
    assert pids(effects, but="") == {first.pid}
    assert "job already completed; acked without running" in second.log()
    assert deliveries(second, message_id) == 1
    assert acks(first, message_id) == []
    assert acks(second, message_id) == ["SUCCESS"]
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert doc["status"] == "completed"
    assert doc["epoch"] == 1
    assert doc["attempts"] == 1
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}
    assert_not_redelivered(subscriber, sub_path, lease_s=LEASE_S)


@BOTH_FLAVOURS
def test_one_key_published_twice_to_one_worker_is_processed_once(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Duplicate publish: two message ids, one key (``op``), one payload, one worker.

    Both deliveries reach the same process at once; the second waits for the
    key behind the first, then finds the job completed and acks without
    running anything. Steps run once, both messages are acked.
    """
    sub_path = eod_subscription.subscription_path
    worker = workers({**worker_env, "CHAOS_STEP_SLEEP_S": "0.5"}, "worker")
    ids = [
        publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        for _ in range(2)
    ]
    for message_id in ids:
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    kill(worker)

    assert [deliveries(worker, message_id) for message_id in ids] == [1, 1]
    assert [acks(worker, message_id) for message_id in ids] == [["SUCCESS"], ["SUCCESS"]]
    assert worker.log().count("completed (attempt 1, epoch 1)") == 1
    assert worker.log().count("job already completed; acked without running") == 1
    assert effects.by_effect() == {"a": 1, "b": 1, "c": 1}
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}


def test_a_redelivery_to_the_same_worker_adopts_the_running_delivery(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Inside step b the message's deadline drops to 0, as when a lease lapses with no fault
    of this process: Pub/Sub redelivers it to the same worker while b still runs. The newer
    delivery adopts the running one: it claims nothing and runs nothing, the running one
    finishes b and c and completes the job without acking (its ack id is stale), and the
    newer one acks from the record. Every step runs once, at epoch 1."""
    sub_path = eod_subscription.subscription_path
    worker = workers({**worker_env, "CHAOS_SCENARIO": "redelivered_in_b"}, "worker")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    time.sleep(1)  # anything else it would do would show below
    kill(worker)

    assert deliveries(worker, message_id) == 2
    assert acks(worker, message_id) == ["SUCCESS"]
    assert worker.log().count(f"drop of message {message_id}") == 1  # the stale delivery
    assert effects.by_effect() == {"a": 1, "deadline-0": 1, "b": 1, "c": 1}
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}


def test_one_key_published_twice_to_two_workers_is_processed_once(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Duplicate publish across processes: the second message reaches another worker mid-job.

    The first worker holds the job (claimed, inside step b) when the second
    message with the same key is delivered to the second worker. That one
    finds a live claim, waits, then sees the job completed and acks without
    running anything. Steps run once, both messages are acked.
    """
    sub_path = eod_subscription.subscription_path
    with TcpProxy(emulators.pubsub_host or "") as pubsub_link:
        env = {**worker_env, "PUBSUB_EMULATOR_HOST": pubsub_link.address, "CHAOS_GATES": "step:b"}
        owner = workers(env, "owner")
        first_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "step:b")
        assert gate.wait_arrived() == owner.pid
        # Only the second worker may get the second message: take the owner off
        # Pub/Sub for a moment (it reconnects when resumed; its lease is intact).
        owner.pause()
        pubsub_link.cut()
        end_stale_streams(subscriber, sub_path)
        other = workers(worker_env, "other")
        second_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        other.wait_for_log(f'"message": "received message {second_id}"', timeout_s=30)
        time.sleep(0.5)  # let it find the owner's live claim (no log line to poll for)
        owner.resume()
        gate.release()
        owner.wait_for_log(f"ack of message {first_id}: SUCCESS", timeout_s=30)
        other.wait_for_log(f"ack of message {second_id}: SUCCESS", timeout_s=30)
        kill(owner, other)

    assert (deliveries(owner, first_id), deliveries(owner, second_id)) == (1, 0)
    assert (deliveries(other, first_id), deliveries(other, second_id)) == (0, 1)
    assert "completed (attempt 1, epoch 1)" in owner.log()
    assert "job already completed; acked without running" in other.log()
    assert "another owner holds the job" not in other.log()  # it waited, then acked
    assert (acks(owner, first_id), acks(other, second_id)) == (["SUCCESS"], ["SUCCESS"])
    assert runs(effects, "a") == runs(effects, "b") == runs(effects, "c") == [(owner.pid, 1)]
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}


def test_sigkilled_workers_message_is_redelivered_within_about_one_lease(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Crash window: SIGKILL inside step a; how long until another worker has the job.

    ``run()`` sets the subscriber's lease settings from ``LEASE_SECONDS``, so a
    dead worker's message comes back after about one lease (not after the
    client's default of an hour, nor the 60 s it otherwise uses with
    exactly-once delivery). Measured from the kill to the rescuer's run of
    step a; the bound is generous (3 leases) for a loaded machine.
    """
    first = workers({**worker_env, "CHAOS_KILL_AT": "step:a"}, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    first.process.wait(timeout=60)
    killed_at = time.monotonic()
    end_stale_streams(subscriber, eod_subscription.subscription_path)
    rescuer = workers(worker_env, "rescuer")
    effects.wait_until("a", 1, timeout_s=3 * LEASE_S)
    redelivered_after_s = time.monotonic() - killed_at
    print(f"redelivered {redelivered_after_s:.1f} s after the kill (lease {LEASE_S} s)")
    assert redelivered_after_s < 3 * LEASE_S

    rescuer.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    assert "completed (attempt 2, epoch 2)" in rescuer.log()
    assert effects.by_effect() == {"killed": 1, "a": 1, "b": 1, "c": 1}
    assert pids(effects) == {rescuer.pid}
    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, "op-1"
    )
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 2)
    assert step_epochs(doc) == {"a": 2, "b": 2, "c": 2}
