"""Network faults between a worker and Firestore, through a TCP proxy: each step recorded once.

The worker's ``FIRESTORE_EMULATOR_HOST`` points at a :class:`~emulator.TcpProxy`.
A gate holds the worker inside a step, so the fault starts at a known point
of the job: a connection cut while the step runs, or a partition (blackhole)
across the commit of the completion, healed either by delivering the held
bytes late or by losing them. The job store must settle every write whose
outcome it did not see (by reading the ``write_id`` back) without applying
it twice and without mistaking its own landed write for another owner's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from google.cloud import firestore

from emulator import Emulators, SubscriptionHandle, TcpProxy
from pubsub_worker._job.keys import document_id
from tests.support.gate import Gate
from tests.support.observe import acks, deliveries, job_document, runs, step_epochs
from tests.support.processes import Effects, Worker

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

RPC_TIMEOUT_S = 1.0
"""Per-RPC timeout of the job store in the partition tests (the default is 10 s)."""


def assert_completed_once(
    worker: Worker,
    message_id: str,
    effects: Effects,
    firestore_client: Any,
    collection: str,
    subscription: SubscriptionHandle,
) -> None:
    """One run of each step, recorded at epoch 1; completed and acked by its only delivery."""
    assert runs(effects, "a") == runs(effects, "b") == runs(effects, "c") == [(worker.pid, 1)]
    log = worker.log()
    assert "completed (attempt 1, epoch 1)" in log
    assert "ownership lost" not in log
    assert "lost ownership" not in log
    assert deliveries(worker, message_id) == 1
    assert acks(worker, message_id) == ["SUCCESS"]
    doc = job_document(firestore_client, collection, subscription.subscription_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}


def test_firestore_connection_cut_during_a_step_completes_once(
    emulators: Emulators,
    publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Fault: every Firestore connection of the worker is reset while step b runs.

    The worker's next write (the record of b) goes out on a reset channel: it
    reconnects, or its store settles the failed call by reading back. The job
    completes at epoch 1, each step run and recorded once.
    """
    with TcpProxy(emulators.firestore_host or "") as firestore_link:
        env = {
            **worker_env,
            "FIRESTORE_EMULATOR_HOST": firestore_link.address,
            "CHAOS_GATES": "step:b",
        }
        worker = workers(env, "worker")
        message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "step:b")
        gate.wait_arrived()
        assert firestore_link.cut() >= 1  # the claim and the record of a went through it
        gate.release()
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
        assert firestore_link.connections >= 1  # it reconnected through the proxy
        worker.kill()
    assert_completed_once(
        worker, message_id, effects, firestore_client, firestore_collection, eod_subscription
    )


@pytest.mark.parametrize("store", ["batching", "plain"])
@pytest.mark.parametrize(
    "held_bytes",
    [
        pytest.param("delivered", id="partition-heals"),
        pytest.param("lost", id="partition-heals-after-a-reset"),
    ],
)
def test_completion_commit_across_a_firestore_partition_lands_once(
    store: str,
    held_bytes: str,
    emulators: Emulators,
    publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Fault: a partition across the commit of the completion (with step c's record).

    The proxy stops forwarding just before the commit is sent; the commit
    times out (1 s), so does the read that should settle it, and the store
    keeps retrying that read. Then the partition heals: either the held bytes
    are delivered late (the commit may land after its caller gave up on it:
    the read finds its ``write_id``; or it was cancelled: the read finds the
    old version and the commit is sent again), or the connections are reset
    first and the held bytes lost (nothing landed; the commit is sent again).
    Either way the completion lands once, the worker knows it completed (no
    false "lost ownership"), and it acks. Run against both job stores:
    ``FirestoreJobStore`` and the batching one.
    """
    with TcpProxy(emulators.firestore_host or "") as firestore_link:
        env = {
            **worker_env,
            "FIRESTORE_EMULATOR_HOST": firestore_link.address,
            "CHAOS_GATES": "step:c",
            "CHAOS_STORE": store,
            "CHAOS_STORE_RPC_TIMEOUT_S": str(RPC_TIMEOUT_S),
        }
        worker = workers(env, "worker")
        message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
        gate = Gate(effects.path, "step:c")
        gate.wait_arrived()
        firestore_link.blackhole(True)
        gate.release()  # step c ends, the completion commit goes into the partition
        # The commit timed out, and so did the read that settles it: the partition covers both.
        worker.wait_for_log(
            '"message": "Firestore get failed (504 Deadline Exceeded)', timeout_s=30
        )
        if held_bytes == "lost":
            firestore_link.cut()
        firestore_link.blackhole(False)
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
        worker.kill()
    assert_completed_once(
        worker, message_id, effects, firestore_client, firestore_collection, eod_subscription
    )


@pytest.mark.parametrize("store", ["batching", "plain"])
def test_completion_commit_delayed_past_its_timeout_lands_once(
    store: str,
    publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Fault: the server applies the completion commit after the client gave up on it.

    The test holds a transaction that has read the job document, so the
    emulator queues the worker's completion commit behind that lock (a slow
    commit). The client times out (1 s) and reads back: the old version, the
    write not there yet, so it sends the commit again, which queues too. Then
    the lock goes away: the first commit lands late, the second finds the
    version changed, by the worker's own write. The store must recognise its
    write (same ``write_id``) instead of reporting a conflict, which would
    read as a lost ownership of a job the worker had just completed.
    """
    env = {
        **worker_env,
        "CHAOS_GATES": "step:c",
        "CHAOS_STORE": store,
        "CHAOS_STORE_RPC_TIMEOUT_S": str(RPC_TIMEOUT_S),
    }
    worker = workers(env, "worker")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    gate = Gate(effects.path, "step:c")
    gate.wait_arrived()
    job = firestore_client.collection(firestore_collection).document(
        document_id(eod_subscription.subscription_path, "op-1")
    )
    with job_locked(firestore_client, job):
        gate.release()  # step c ends; the completion commit waits for the lock
        worker.wait_for_log(
            '"message": "Firestore update failed (504 Deadline Exceeded)', timeout_s=30
        )
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    worker.kill()
    assert_completed_once(
        worker, message_id, effects, firestore_client, firestore_collection, eod_subscription
    )


@contextmanager
def job_locked(firestore_client: Any, ref: Any) -> Iterator[None]:
    """Hold a transaction that has read ``ref`` (the emulator locks it) until the block ends.

    The emulator lets a write wait about 2 s for such a lock, then aborts it;
    the block must end sooner for the queued writes to land.
    """
    locked, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    class Rollback(Exception):
        pass

    @firestore.transactional
    def hold(transaction: Any) -> None:
        ref.get(transaction=transaction)
        locked.set()
        done.wait(10)
        raise Rollback  # nothing written: the transaction is rolled back

    def run() -> None:
        try:
            hold(firestore_client.transaction())
        except Rollback:
            pass
        except BaseException as exc:
            failure.append(exc)
            locked.set()

    holder = threading.Thread(target=run, name="job-lock-holder", daemon=True)
    holder.start()
    assert locked.wait(10), "the lock-holding transaction did not start"
    try:
        yield
    finally:
        done.set()
        holder.join(10)
    assert not failure, failure
