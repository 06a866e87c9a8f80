"""The failure path and the outbox, with real worker processes and exact counts.

A job sent to review first confirms, with a fenced write of its document,
that it still owns the job; then it publishes the outbox entries its
committed steps left unsent; only then does it publish to the failure topic
and record ``failed``. So a stale owner (frozen past its lease while another
worker took the job over) publishes nothing for review, and an entry whose
publish failed in its step goes out with the failure, or, if it still
cannot, when the job is replayed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core.exceptions import NotFound

from emulator import Emulators, SubscriptionHandle, TcpProxy, unique_id
from tests.support.gate import Gate
from tests.support.observe import (
    acks,
    collect,
    end_stale_streams,
    job_document,
    nacks,
    runs,
    wait_until_let_go,
)
from tests.support.processes import Effects, run_cli

KEY = "op-1"

REDELIVERY_S = 100
"""How long a test waits for a frozen worker's message to reach the second worker
(one lease, or a few when the emulator redelivers into the frozen worker's stream)."""

FENCED_LEASE_S = 30
"""The frozen owner's lease when ``jobs release`` fences it: longer than the command takes,
so its lease keeper still holds the delivery when it wakes."""

QUIET_S = 2.0
"""How long a subscription is read after the last worker let go, to see what came."""

pytestmark = [pytest.mark.emulator, pytest.mark.chaos, pytest.mark.timeout(3 * REDELIVERY_S)]


@pytest.fixture
def pubsub_proxy(emulators: Emulators) -> Iterator[TcpProxy]:
    """A proxy in front of the Pub/Sub emulator, for the worker that is frozen."""
    assert emulators.pubsub_host is not None
    with TcpProxy(emulators.pubsub_host) as proxy:
        yield proxy


@pytest.fixture
def late_output(emulators: Emulators, publisher: Any, subscriber: Any) -> Iterator[Any]:
    """An output topic path that does not exist until the test calls ``create()``.

    ``create()`` makes the topic and a subscription to read it, and returns the
    subscription path; both are deleted after the test.
    """
    name = unique_id("late")
    topic = f"projects/{emulators.project}/topics/{name}"
    subscription = f"projects/{emulators.project}/subscriptions/{name}"

    class Late:
        topic_path = topic
        subscription_path = subscription

        @staticmethod
        def create() -> str:
            publisher.create_topic(request={"name": topic})
            subscriber.create_subscription(
                request={"name": subscription, "topic": topic, "ack_deadline_seconds": 10}
            )
            return subscription

    yield Late
    with contextlib.suppress(NotFound):
        subscriber.delete_subscription(request={"subscription": subscription})
    with contextlib.suppress(NotFound):
        publisher.delete_topic(request={"topic": topic})


def outbox_state(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    """``(effect key, sent)`` of every outbox entry of a job document."""
    return sorted((e["effect_key"], e["sent"]) for e in (doc.get("outbox") or {}).values())


@pytest.mark.parametrize(
    ("second_scenario", "reviews"),
    [
        pytest.param("permanent_in_step", 1, id="new-owner-fails-it"),
        pytest.param("steps", 0, id="new-owner-completes-it"),
    ],
)
def test_a_stale_owner_past_its_lease_publishes_nothing_for_review(
    second_scenario: str,
    reviews: int,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
    pubsub_proxy: TcpProxy,
) -> None:
    """The first worker is frozen (SIGSTOP) inside step ``a`` past its lease; a second
    worker takes the job over at epoch 2 and fails it (one failure message) or completes
    it (none). Woken up, the first raises ``PermanentError``: the failure topic gets
    exactly the new owner's count, and the stale delivery is let go without an ack.

    Which fence stops the stale one depends on a race inside it: if its lease keeper
    gives its stalled delivery up first, the outcome drops it (superseded); if its
    handler raises first, its failure path's fenced write is refused before it
    publishes. The test below makes the second path certain."""
    review = make_subscription(exactly_once=False)
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "permanent_in_step",
        "CHAOS_GATES": "step:a",
        "PUBSUB_WORKER_MAX_ATTEMPTS": "3",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    first = workers({**env, "PUBSUB_EMULATOR_HOST": pubsub_proxy.address}, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op=KEY).result()
    gate = Gate(effects.path, "step:a")
    assert gate.wait_arrived() == first.pid
    first.pause()  # SIGSTOP: nothing of the process runs, its leases lapse
    pubsub_proxy.cut()
    # The emulator does not notice a cut stream and may go on redelivering into it (once
    # past REDELIVERY_S on a loaded machine): its streams ended, the job comes back to the
    # second one lease after the first's last extension.
    end_stale_streams(subscriber, eod_subscription.subscription_path)
    gate.release()  # takes effect only once it runs again

    second = workers({**env, "CHAOS_SCENARIO": second_scenario}, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=REDELIVERY_S)
    first.resume()
    first.wait_for_log(
        "lost ownership: the job was claimed at epoch 2 (ours: 1)",
        "superseded while running",
        timeout_s=30,
    )
    wait_until_let_go(first, message_id)
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + QUIET_S)

    assert acks(first, message_id) == []
    assert runs(effects, "a") == [(second.pid, 2), (first.pid, 1)]
    assert len(reviewed) == reviews
    for message in reviewed:
        attributes = dict(message.attributes)
        assert (attributes["pubsub_worker_key"], attributes["pubsub_worker_attempts"]) == (
            KEY,
            "2",
        )
    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, KEY
    )
    expected = "failed" if reviews else "completed"
    assert (doc["status"], doc["epoch"], doc["attempts"]) == (expected, 2, 2)


def test_a_stale_owner_fenced_inside_its_lease_publishes_nothing_for_review(
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
    """The owner is frozen (SIGSTOP) inside step ``a``, well inside its lease, and
    ``jobs release`` takes the job from it (epoch 2). Woken up, its delivery still
    current, it raises ``PermanentError``: the failure path's fenced write is refused
    before anything is published, the delivery is nacked, and the redelivery claims the
    job at epoch 3 and sends it to review: exactly one failure message."""
    review = make_subscription(exactly_once=False)
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "permanent_in_step",
        "CHAOS_GATES": "step:a",
        "PUBSUB_WORKER_LEASE_SECONDS": str(FENCED_LEASE_S),
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    owner = workers(env, "owner")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op=KEY).result()
    gate = Gate(effects.path, "step:a")
    assert gate.wait_arrived() == owner.pid
    owner.pause()
    gate.release()  # takes effect when the process is resumed
    released = run_cli({**os.environ, **env}, "jobs", "release", KEY, "--epoch", "1")
    assert released.returncode == 0, released.stderr
    owner.resume()

    owner.wait_for_log("lost ownership: the job was claimed at epoch 2 (ours: 1)", timeout_s=30)
    owner.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=3 * FENCED_LEASE_S)
    owner.kill()
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + QUIET_S)

    assert "superseded while running" not in owner.log()  # the failure path ran, and stopped
    assert nacks(owner, message_id) == 1
    assert runs(effects, "a") == [(owner.pid, 1), (owner.pid, 3)]
    assert len(reviewed) == 1
    attributes = dict(reviewed[0].attributes)
    assert (attributes["pubsub_worker_key"], attributes["pubsub_worker_attempts"]) == (KEY, "2")
    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, KEY
    )
    assert (doc["status"], doc["reason"], doc["epoch"], doc["attempts"]) == (
        "failed",
        "permanent",
        3,
        2,
    )


def test_an_entry_left_unsent_by_its_step_goes_out_before_the_failure_message(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    late_output: Any,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Step ``produce`` commits its outbox entry, but the output topic does not exist yet:
    its publish fails and the entry stays unsent. The topic is created, then the handler
    raises ``PermanentError``: the failure path publishes the entry (its step committed),
    with its effect key, then the failure message; the failed record shows it sent."""
    review = make_subscription(exactly_once=False)
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "outbox_permanent",
        "CHAOS_OUTPUT_TOPIC": late_output.topic_path,
        "CHAOS_GATES": "before_raise",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = workers(env)
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op=KEY).result()
    gate = Gate(effects.path, "before_raise")
    gate.wait_arrived()
    assert "not published" in worker.log()  # the step's own publish failed
    output = late_output.create()
    gate.release()
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    worker.kill()
    outputs = collect(subscriber, output, until=time.monotonic() + QUIET_S)
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + QUIET_S)

    assert [m.attributes["effect_key"] for m in outputs] == [f"{KEY}:produce:0"]
    assert [m.data for m in outputs] == [b"output:payload"]
    assert [m.attributes["pubsub_worker_reason"] for m in reviewed] == ["permanent"]
    assert effects.by_effect() == {"produce": 1, "raise": 1}
    doc = job_document(
        firestore_client, firestore_collection, eod_subscription.subscription_path, KEY
    )
    assert (doc["status"], doc["attempts"]) == ("failed", 1)
    assert outbox_state(doc) == [(f"{KEY}:produce:0", True)]


def test_an_entry_that_still_cannot_go_out_is_kept_shown_and_published_on_replay(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    late_output: Any,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """The output topic is missing through the whole failure path: the job is reviewed
    once and recorded ``failed`` with its entry unsent, which ``jobs show`` lists as
    published on replay. Once the topic exists, ``jobs replay`` revives the job: the
    claim of the replayed message publishes the entry (once, same effect key) before the
    handler runs; the handler skips the recorded step and is reviewed a second time."""
    review = make_subscription(exactly_once=False)
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "outbox_permanent",
        "CHAOS_OUTPUT_TOPIC": late_output.topic_path,
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    worker = workers(env)
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op=KEY).result()
    worker.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=30)
    assert "kept unsent in the failed record" in worker.log()
    sub_path = eod_subscription.subscription_path
    doc = job_document(firestore_client, firestore_collection, sub_path, KEY)
    assert (doc["status"], doc["epoch"]) == ("failed", 1)
    assert outbox_state(doc) == [(f"{KEY}:produce:0", False)]

    cli_env = {**os.environ, **worker_env}
    shown = run_cli(cli_env, "jobs", "show", KEY)
    assert shown.returncode == 0, shown.stderr
    assert "NOT SENT (published on replay)" in shown.stdout
    assert (
        "unsent       1 outbox entry of committed steps not published; published, with the "
        f"same effect keys, when the job is replayed (pubsub-worker jobs replay {KEY})"
    ) in shown.stdout

    output = late_output.create()
    replayed = run_cli(cli_env, "jobs", "replay", KEY, "--fan-out")  # the one subscription
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    deadline = time.monotonic() + 60
    while worker.log().count('"message": "ack of message ') < 2:
        assert time.monotonic() < deadline, worker.log()[-4000:]
        time.sleep(0.1)
    worker.kill()
    outputs = collect(subscriber, output, until=time.monotonic() + QUIET_S)
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + QUIET_S)

    assert [m.attributes["effect_key"] for m in outputs] == [f"{KEY}:produce:0"]
    assert [m.attributes["pubsub_worker_reason"] for m in reviewed] == ["permanent"] * 2
    assert runs(effects, "produce") == [(worker.pid, 1)]  # the replayed run skipped it
    assert runs(effects, "raise") == [(worker.pid, 1), (worker.pid, 3)]  # epoch 2: the reset
    doc = job_document(firestore_client, firestore_collection, sub_path, KEY)
    assert (doc["status"], doc["epoch"]) == ("failed", 3)
    assert outbox_state(doc) == [(f"{KEY}:produce:0", True)]
    shown = run_cli(cli_env, "jobs", "show", KEY)
    assert "NOT SENT" not in shown.stdout
