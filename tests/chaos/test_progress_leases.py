"""Progress keeps both leases, whatever is or is not written yet.

A step's record is kept for the next write (a one-step job costs two
writes). A job that spends most of a lease in a step and then a little more
in plain handler code must still hold its job document: otherwise another
owner takes a healthy job over and runs its finished step again.
"""

from __future__ import annotations

import time
from typing import Any

from google.cloud import firestore

from emulator import SubscriptionHandle
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import derive_identity
from pubsub_worker.stores import FirestoreJobStore
from tests.chaos.conftest import LEASE_S
from tests.support.observe import job_document, runs
from tests.support.processes import Effects


def test_a_step_of_most_of_a_lease_then_plain_code_keeps_the_job(
    publisher: Any,
    firestore_client: firestore.Client,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Step ``a`` runs 0.9 of a lease, then the handler sleeps 0.4 of a lease, then ``b``, ``c``.

    1.1 leases after the claim, another owner tries to claim the job: its
    document must still be held (the step's progress renewed the lease), so
    the claim is refused as busy, and step ``a`` runs once.
    """
    env = {
        **worker_env,
        "CHAOS_STEP_SLEEP_S": str(0.9 * LEASE_S),
        "CHAOS_SLEEP_STEPS": "a",
        "CHAOS_PLAIN_SLEEP_S": str(0.4 * LEASE_S),
    }
    worker = workers(env, "progress")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    worker.wait_for_log(f"received message {message_id}", timeout_s=30)
    claimed_at = time.monotonic()
    deadline = claimed_at + 30
    while not runs(effects, "a") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs(effects, "a") == [(worker.pid, 1)]
    time.sleep(max(claimed_at + 1.1 * LEASE_S - time.monotonic(), 0))  # in the plain code

    store = FirestoreJobStore(firestore_client, firestore_collection)
    identity = derive_identity(
        subscription=eod_subscription.subscription_path,
        message_id="elsewhere",
        attributes={"op": "op-1"},
        data=b"payload",
        key_attribute="op",
    )
    other = claim(
        store,
        ClaimRequest(
            identity=identity,
            owner="other-host/4242/beef",
            message_id="elsewhere",
            delivery="elsewhere",
            lease_s=LEASE_S,
            retention_s=3600,
            abandoned=lambda _m, _d: False,
        ),
        exists_hint=True,
    )
    assert other.kind is ClaimKind.BUSY, other  # the healthy owner still holds its job

    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    assert runs(effects, "a") == [(worker.pid, 1)]
    assert runs(effects, "b") == [(worker.pid, 1)]
    assert runs(effects, "c") == [(worker.pid, 1)]
    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, "op-1"
    )
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
