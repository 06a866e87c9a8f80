"""``pubsub-worker jobs release`` against a real, frozen owner: its commit is refused.

A worker process holds inside step ``b`` (a gate) and is frozen (SIGSTOP)
well inside its lease, so only the release can take the job from it. The
operator releases the job with the real command (a subprocess, as from a
shell); the frozen worker, woken, finishes step b's function (a step's
function runs at least once) but its record of b is refused by the new
epoch and it stops without an ack. The redelivery claims the job at the
next epoch, skips a and runs b and c. Every effect and record is counted.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    assert_not_redelivered,
    job_document,
    runs,
    step_epochs,
    wait_until_let_go,
)
from tests.support.processes import Effects, run_cli

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

RELEASE_LEASE_S = 30
"""The frozen owner's lease: longer than the commands that release its job can take."""


def test_release_fences_a_frozen_owner_whose_commit_is_then_refused(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    sub_path = eod_subscription.subscription_path
    # A lease long enough for the two commands to run while the owner is frozen: a pause
    # past the lease would let its lease keeper give the delivery up first, on waking,
    # and the commit this test is about would never be tried.
    env_owner = {
        **worker_env,
        "CHAOS_GATES": "step:b",
        "PUBSUB_WORKER_LEASE_SECONDS": str(RELEASE_LEASE_S),
    }
    owner = workers(env_owner, "owner")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    gate = Gate(effects.path, "step:b")
    assert gate.wait_arrived() == owner.pid  # step a is recorded; b has started
    owner.pause()
    gate.release()  # takes effect when the process is resumed

    env = {**os.environ, **worker_env}
    shown = run_cli(env, "jobs", "show", "op-1")
    assert shown.returncode == 0, shown.stderr
    assert "status       running (epoch 1, attempts 1)" in shown.stdout
    assert f"/{owner.pid}/" in shown.stdout  # the owner: host/pid/random
    released = run_cli(env, "jobs", "release", "op-1", "--epoch", "1")
    assert released.returncode == 0, released.stderr
    lines = released.stdout.splitlines()
    assert lines[0] == "released op-1: epoch 1 -> 2, status running -> released"
    assert f"/{owner.pid}/" in lines[1]
    # The frozen owner's lease has some seconds left, or lapsed already on a slow machine.
    assert lines[2].endswith("(Firestore's clock); steps kept: a; attempts stay 1")
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], step_epochs(doc)) == ("released", 2, {"a": 1})

    owner.resume()
    owner.wait_for_log("lost ownership: the job was claimed at epoch 2 (ours: 1)")
    wait_until_let_go(owner, message_id)
    # Its delivery was let go: the redelivery (after the lease) takes the job at epoch 3.
    owner.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=3 * RELEASE_LEASE_S + 30)
    owner.kill()

    assert runs(effects, "a") == [(owner.pid, 1)]
    # b: the frozen owner's late run (refused), then the redelivery's (recorded)
    assert runs(effects, "b") == [(owner.pid, 1), (owner.pid, 3)]
    assert runs(effects, "c") == [(owner.pid, 3)]
    assert acks(owner, message_id) == ["SUCCESS"]
    assert "completed (attempt 2, epoch 3)" in owner.log()
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 3, 2)
    assert step_epochs(doc) == {"a": 1, "b": 3, "c": 3}
    assert_not_redelivered(subscriber, sub_path, lease_s=RELEASE_LEASE_S)
