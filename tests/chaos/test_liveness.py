"""Holes in liveness and bad input, closed: each with real worker processes, counts exact.

Long jobs keep their delivery while they progress (and a stall is still
given up); a committed outbox entry is never left unsent; what the library
publishes stays within Pub/Sub's production limits; a job document stays
under Firestore's 1 MiB; a failure path that fails never loops hot; an
unchanged ``callback(message)`` is released on shutdown like a job.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from emulator.pytest_plugin import MakeSubscription
from pubsub_worker._support.limits import MAX_DOCUMENT_BYTES, document_bytes, problems
from tests.chaos.conftest import LEASE_S
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    assert_not_redelivered,
    collect,
    deliveries,
    drops,
    end_stale_streams,
    job_document,
    nacks,
    runs,
    step_epochs,
)
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]


@dataclass(frozen=True)
class ChaosSetup:
    """What every test here works with: the emulators' clients, a subscription, workers."""

    emulators: Emulators
    publisher: Any
    subscriber: Any
    firestore_client: Any
    collection: str
    """The job documents' collection."""
    subscription: SubscriptionHandle
    """The exactly-once subscription the workers consume (``worker_env``'s)."""
    make_subscription: MakeSubscription
    env: dict[str, str]
    """A worker's environment on :attr:`subscription` (the ``worker_env`` fixture)."""
    effects: Effects
    workers: Any
    """``workers(env, name)`` starts a worker process (the ``workers`` fixture)."""

    def publish(self, data: bytes, **attributes: str) -> str:
        """Publish one job message to the subscription's topic; its message id."""
        return str(
            self.publisher.publish(self.subscription.topic_path, data, **attributes).result()
        )

    def job_document(self, key: str) -> dict[str, Any]:
        """The job document of ``key``; fails if there is none."""
        return job_document(
            self.firestore_client, self.collection, self.subscription.subscription_path, key
        )


@pytest.fixture
def chaos(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    make_subscription: MakeSubscription,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> ChaosSetup:
    return ChaosSetup(
        emulators=emulators,
        publisher=publisher,
        subscriber=subscriber,
        firestore_client=firestore_client,
        collection=firestore_collection,
        subscription=eod_subscription,
        make_subscription=make_subscription,
        env=worker_env,
        effects=effects,
        workers=workers,
    )


def test_long_jobs_that_progress_keep_their_delivery_one_at_a_time(chaos: ChaosSetup) -> None:
    """Three jobs of two 6 s heartbeating steps (1.2 leases a job) on MAX_MESSAGES=1.

    The third message waits 2.4 leases for its turn. Each job keeps its one
    delivery from receipt to ack (no redelivery, so no step runs twice), and
    the jobs run strictly one after the other: flow control holds the slot
    until the job is settled.
    """
    env = {
        **chaos.env,
        "PUBSUB_WORKER_MAX_MESSAGES": "1",
        "CHAOS_SCENARIO": "steps",
        "CHAOS_STEP_SLEEP_S": "6",
        "CHAOS_SLEEP_STEPS": "a,b",
        "CHAOS_HEARTBEAT": "1",
    }
    worker = chaos.workers(env, "long")
    ids = [chaos.publish(b"payload", op=f"op-{n}") for n in (1, 2, 3)]
    for message_id in ids:
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=120)

    assert chaos.effects.by_effect() == {"a": 3, "b": 3, "c": 3}
    for n in (1, 2, 3):
        for step in ("a", "b", "c"):
            assert runs(chaos.effects, step, key=f"op-{n}") == [(worker.pid, 1)]
    assert [deliveries(worker, m) for m in ids] == [1, 1, 1]
    assert [acks(worker, m) for m in ids] == [["SUCCESS"]] * 3
    keys = [str(e["key"]) for e in chaos.effects.read()]
    blocks = [key for i, key in enumerate(keys) if i == 0 or keys[i - 1] != key]
    assert len(blocks) == 3  # never two jobs at once: a, b, c of one, then the next
    assert_not_redelivered(chaos.subscriber, chaos.subscription.subscription_path, lease_s=LEASE_S)


def test_a_stalled_job_is_given_up_and_recovered(chaos: ChaosSetup) -> None:
    """Step b of epoch 1 sleeps 25 s without a heartbeat (2.5 leases).

    The client keeps every message leased up to the cap, but the worker's own
    lease keeper gives a job without progress for a lease up: Pub/Sub
    redelivers it, to this same worker. The redelivery waits for the stalled
    delivery (one delivery of a message runs at a time in a process), which,
    waking up, stops at its next boundary and neither commits nor acks; epoch 2
    then finishes the job and acks.
    """
    env = {
        **chaos.env,
        "CHAOS_STEP_SLEEP_S": "25",
        "CHAOS_SLEEP_STEPS": "b",
        "CHAOS_SLEEP_EPOCHS": "1",
    }
    worker = chaos.workers(env, "stall")
    message_id = chaos.publish(b"payload", op="op-1")
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    worker.wait_for_log(f"drop of message {message_id}", timeout_s=30)

    assert runs(chaos.effects, "a") == [(worker.pid, 1)]
    # Epoch 1's late run of b ended before epoch 2's began: never two at once in a process.
    assert runs(chaos.effects, "b") == [(worker.pid, 1), (worker.pid, 2)]
    assert runs(chaos.effects, "c") == [(worker.pid, 2)]
    assert deliveries(worker, message_id) == 2
    assert acks(worker, message_id) == ["SUCCESS"]
    assert drops(worker, message_id) == 1
    assert "no progress for a lease" in worker.log()
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["epoch"]) == ("completed", 2)
    assert step_epochs(doc) == {"a": 1, "b": 2, "c": 2}


def test_an_outbox_entry_is_never_left_unsent(chaos: ChaosSetup) -> None:
    """The output topic does not exist yet: the step's publish fails, and the handler
    swallows any error. The job is not completed while its entry is unsent: it is released
    (no attempt counted) and comes back after a backoff; once the topic exists, the
    redelivery publishes the entry, once, without running the step again."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"projects/{chaos.emulators.project}/topics/late-{suffix}"
    output = f"projects/{chaos.emulators.project}/subscriptions/late-{suffix}"
    env = {**chaos.env, "CHAOS_SCENARIO": "outbox_swallow", "CHAOS_OUTPUT_TOPIC": topic}
    worker = chaos.workers(env, "outbox")
    message_id = chaos.publish(b"job", op="op-1")
    worker.wait_for_log(f"nack of message {message_id} (release)", timeout_s=30)
    chaos.publisher.create_topic(request={"name": topic})
    chaos.subscriber.create_subscription(request={"name": output, "topic": topic})
    try:
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
        outputs = collect(chaos.subscriber, output, until=time.monotonic() + 2, at_least=1)
    finally:
        chaos.subscriber.delete_subscription(request={"subscription": output})
        chaos.publisher.delete_topic(request={"topic": topic})

    assert chaos.effects.by_effect() == {"produce": 1}  # nothing to swallow: the step committed
    assert [(m.data, m.attributes["effect_key"]) for m in outputs] == [
        (b"output:job", "op-1:produce:0")
    ]
    assert deliveries(worker, message_id) == 2
    assert acks(worker, message_id) == ["SUCCESS"]
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 1)
    assert [entry["sent"] for entry in doc["outbox"].values()] == [True]


def test_publish_outside_a_step_is_its_own_step_and_survives_a_crash(chaos: ChaosSetup) -> None:
    """``job.publish()`` outside any step: committed as step ``~publish.1``, then published.
    Killed after the publish, before the sent mark: the rescuer republishes the same entry
    with the same effect key, so a keyed consumer sees one output."""
    out = chaos.make_subscription(exactly_once=False, prefix="out")
    env = {**chaos.env, "CHAOS_SCENARIO": "publish_outside", "CHAOS_OUTPUT_TOPIC": out.topic_path}
    first = chaos.workers({**env, "CHAOS_KILL_AT": "after_publish"}, "first")
    message_id = chaos.publish(b"job", op="op-1")
    first.process.wait(timeout=60)
    end_stale_streams(chaos.subscriber, chaos.subscription.subscription_path)
    second = chaos.workers(env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    outputs = collect(
        chaos.subscriber, out.subscription_path, until=time.monotonic() + 2, at_least=2
    )

    assert "RuntimeError" not in first.log() + second.log()
    assert sorted(m.data for m in outputs) == [b"output:job", b"output:job"]  # two copies ...
    assert {m.attributes["effect_key"] for m in outputs} == {"op-1:~publish.1:0"}  # ... one key
    doc = chaos.job_document("op-1")
    assert doc["status"] == "completed"
    assert step_epochs(doc) == {"~publish.1": 1}
    assert [entry["sent"] for entry in doc["outbox"].values()] == [True]


def test_a_failure_message_fits_production_limits_and_keeps_every_attribute(
    chaos: ChaosSetup,
) -> None:
    """A message with 100 attributes (the most production allows) fails permanently.

    The failure message adds the library's attributes: the originals that no
    longer fit are left out of it (counted in an attribute), never dropped
    silently: the failed record keeps all 100.
    """
    review = chaos.make_subscription(exactly_once=False, prefix="review")
    env = {
        **chaos.env,
        "CHAOS_SCENARIO": "permanent",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = chaos.workers(env, "limits")
    attributes = {f"attribute-{n:02}": "v" * 1000 for n in range(99)}
    attributes["op"] = "op-1"
    message_id = chaos.publish(b"payload", **attributes)
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    reviewed = collect(
        chaos.subscriber, review.subscription_path, until=time.monotonic() + 2, at_least=1
    )

    assert len(reviewed) == 1
    sent = dict(reviewed[0].attributes)
    assert problems(reviewed[0].data, sent) == []
    assert len(sent) == 100
    assert sent["pubsub_worker_reason"] == "permanent"
    assert sent["pubsub_worker_attributes_left_out"] == "7"
    originals = {k: v for k, v in sent.items() if not k.startswith("pubsub_worker_")}
    assert len(originals) == 93
    assert all(attributes[k] == v for k, v in originals.items())
    doc = chaos.job_document("op-1")
    assert doc["status"] == "failed"
    assert json.loads(doc["attributes"]) == attributes


def test_a_result_over_the_document_budget_fails_the_job_once(chaos: ChaosSetup) -> None:
    """Five steps of 200 kB results: the fifth would take the job document past its budget.

    It fails the job with reason ``too_large`` on one failure message, once;
    the four committed steps are kept and no step runs again; the document
    stays under 1 MiB; the message is acked and does not come back.
    """
    review = chaos.make_subscription(exactly_once=False, prefix="review")
    env = {
        **chaos.env,
        "CHAOS_SCENARIO": "big",
        "CHAOS_STEPS": "5",
        "CHAOS_RESULT_BYTES": "200000",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = chaos.workers(env, "big")
    message_id = chaos.publish(b"payload", op="op-1")
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    reviewed = collect(
        chaos.subscriber, review.subscription_path, until=time.monotonic() + 2, at_least=1
    )
    assert_not_redelivered(chaos.subscriber, chaos.subscription.subscription_path, lease_s=LEASE_S)

    assert chaos.effects.by_effect() == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert [m.attributes["pubsub_worker_reason"] for m in reviewed] == ["too_large"]
    assert deliveries(worker, message_id) == 1
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["reason"], doc["attempts"]) == ("failed", "too_large", 1)
    assert sorted(doc["steps"]) == ["s1", "s2", "s3", "s4"]
    assert document_bytes(doc) < MAX_DOCUMENT_BYTES


def test_a_failure_path_that_fails_backs_off_and_loses_nothing(chaos: ChaosSetup) -> None:
    """The failure topic is deleted under a running worker, then a job fails permanently.

    The job's failed record lands (``review: pending``); publishing for review
    fails, so the message is neither acked nor lost, and it comes back after a
    backoff (10 s), not at once. Once the topic is back, the redelivery
    publishes the pending failure message, once, without running the handler
    again.
    """
    review = chaos.make_subscription(exactly_once=False, prefix="review")
    env = {
        **chaos.env,
        "CHAOS_SCENARIO": "permanent",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = chaos.workers(env, "review")
    worker.wait_for_log("consuming ", timeout_s=30)
    chaos.publisher.delete_topic(request={"topic": review.topic_path})
    message_id = chaos.publish(b"payload", op="op-1")
    worker.wait_for_log("failure path failed", timeout_s=30)
    failed_at = time.monotonic()
    chaos.publisher.create_topic(request={"name": review.topic_path})
    again = f"{review.subscription_path}-again"
    chaos.subscriber.create_subscription(request={"name": again, "topic": review.topic_path})
    try:
        worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
        waited_s = time.monotonic() - failed_at
        reviewed = collect(chaos.subscriber, again, until=time.monotonic() + 2, at_least=1)
    finally:
        chaos.subscriber.delete_subscription(request={"subscription": again})

    assert waited_s >= 8  # the deferral's 10 s, not an immediate nack
    assert [e["attempt"] for e in chaos.effects.read()] == [1]  # failed once, never rerun
    assert deliveries(worker, message_id) == 2
    assert nacks(worker, message_id) == 1
    assert acks(worker, message_id) == ["SUCCESS"]
    assert len(reviewed) == 1
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["reason"], doc["review"]) == ("failed", "permanent", "sent")


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        pytest.param(
            "PUBSUB_WORKER_FAILURE_TOPIC",
            "projects/pubsub-worker-test/topics/no-such-topic",
            "the topic does not exist",
            id="missing-failure-topic",
        ),
        pytest.param(
            "PUBSUB_WORKER_OUTBOX_KEY_ATTRIBUTE",
            "pubsub_worker_step",
            "PUBSUB_WORKER_OUTBOX_KEY_ATTRIBUTE='pubsub_worker_step'",
            id="outbox-key-collides-with-the-library",
        ),
    ],
)
def test_start_up_refuses_what_would_fail_later(
    chaos: ChaosSetup, variable: str, value: str, expected: str
) -> None:
    worker = chaos.workers({**chaos.env, variable: value}, "refused")
    assert worker.process.wait(timeout=60) != 0
    log = worker.log()
    assert expected in log
    assert variable in log


def test_an_unchanged_callback_is_released_on_shutdown_like_a_job(chaos: ChaosSetup) -> None:
    """SIGTERM while an unchanged ``callback(message)`` is inside step b (grace 1 s).

    The callback stops at its next step, the job is released without counting
    the attempt and nothing is acked; the next worker runs only step c.
    """
    env = {
        **chaos.env,
        "CHAOS_SCENARIO": "callback_steps",
        "CHAOS_STEP_SLEEP_S": "4",
        "CHAOS_SLEEP_STEPS": "b",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "1",
    }
    first = chaos.workers(env, "first")
    message_id = chaos.publish(b"payload", op="op-1")
    chaos.effects.wait_until("a", 1)
    assert first.terminate(timeout_s=30) == 0
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["attempts"]) == ("released", 0)
    assert acks(first, message_id) == []

    end_stale_streams(chaos.subscriber, chaos.subscription.subscription_path)
    second = chaos.workers(env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    assert runs(chaos.effects, "a") == runs(chaos.effects, "b") == [(first.pid, 1)]
    assert runs(chaos.effects, "c") == [(second.pid, 2)]


def test_unsent_entries_of_an_earlier_owner_go_out_before_the_attempts_check(
    chaos: ChaosSetup,
) -> None:
    """MAX_ATTEMPTS=1 and a kill after the outbox entry is committed, before its publish.

    The rescuer's claim is attempt 2: the job goes to review without running,
    but only after the entry the first owner committed is published, once.
    """
    out = chaos.make_subscription(exactly_once=False, prefix="out")
    review = chaos.make_subscription(exactly_once=False, prefix="review")
    env = {
        **chaos.env,
        "CHAOS_SCENARIO": "outbox",
        "CHAOS_OUTPUT_TOPIC": out.topic_path,
        "PUBSUB_WORKER_MAX_ATTEMPTS": "1",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    first = chaos.workers({**env, "CHAOS_KILL_AT": "before_publish"}, "first")
    message_id = chaos.publish(b"job", op="op-1")
    first.process.wait(timeout=60)
    end_stale_streams(chaos.subscriber, chaos.subscription.subscription_path)
    second = chaos.workers(env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    outputs = collect(
        chaos.subscriber, out.subscription_path, until=time.monotonic() + 2, at_least=1
    )
    reviewed = collect(
        chaos.subscriber, review.subscription_path, until=time.monotonic(), at_least=1
    )

    assert chaos.effects.by_effect() == {"produce": 1, "killed": 1}
    assert [(m.data, m.attributes["effect_key"]) for m in outputs] == [
        (b"output:job", "op-1:produce:0")
    ]
    assert [m.attributes["pubsub_worker_reason"] for m in reviewed] == ["attempts"]
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["reason"], doc["epoch"]) == ("failed", "attempts", 2)
    assert [entry["sent"] for entry in doc["outbox"].values()] == [True]


def test_work_that_finished_is_completed_even_if_the_cap_passes_meanwhile(
    chaos: ChaosSetup,
) -> None:
    """All steps ran; the handler is held 11 s before it returns, past a 10 s cap.

    The cap abandons jobs that are still working; this one's work is done,
    so it is completed (not thrown back to run step c again) and acked.
    """
    env = {
        **chaos.env,
        "PUBSUB_WORKER_MAX_PROCESSING_SECONDS": "10",
        "CHAOS_GATES": "end",
    }
    worker = chaos.workers(env, "cap")
    message_id = chaos.publish(b"payload", op="op-1")
    gate = Gate(chaos.effects.path, "end")
    assert gate.wait_arrived() == worker.pid
    worker.wait_for_log("abandoned after", timeout_s=20)
    gate.release()
    worker.wait_for_log(f"ack of message {message_id}", timeout_s=30)

    assert chaos.effects.by_effect() == {"a": 1, "b": 1, "c": 1}
    doc = chaos.job_document("op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert "completed (attempt 1, epoch 1)" in worker.log()
