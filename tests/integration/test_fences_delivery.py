"""The fences of a delivery on their own: generation, adoption, durable-ack, outbox.

As in ``test_fences.py`` (its harness: real deliveries pulled one at a time,
workers in this process on the real emulators, a delivery held at a named
point): each scenario runs with every fence on, where exact counts show the
fence held, and with its own fence switched off, where the violation it
guards against is observed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pubsub_worker
from emulator import drain_messages, unique_id
from tests.support.observe import step_epochs

from .test_fences import TWINS, Hold, World, settled, steps_handler, switched_off, world

__all__ = ["world"]

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


# -- generation: only the latest delivery of a message settles -------------------------


@TWINS
def test_a_superseded_delivery_never_settles(world: World, fenced: bool) -> None:
    """Two deliveries of one message reach one worker. The first (D1) is held at its
    claim's create; the message comes back (its deadline set to 0, as when a lease
    lapses) and the second (D2) waits for D1, which holds the job's key (it adopts it).
    Let go, D1 claims, runs and completes the job, but its ack id is stale: it is
    dropped, never acked; D2 then finds the job completed and acks. Without the fence,
    the stale delivery settles too: it acks with its old ack id, which Pub/Sub refuses."""
    a = world.node("a", steps_handler(world, "a"))
    held = a.store.hold("create")
    world.publish()
    d1 = world.inbox.next()
    late = a.deliver(d1)
    held.wait_arrived()
    d2 = world.inbox.redeliver(d1)
    adopter = a.deliver(d2)
    time.sleep(0.5)
    assert adopter.is_alive()  # D2 waits for D1: it claims nothing meanwhile

    with switched_off("generation", fenced):
        held.release()
        settled(late, adopter)

    assert world.inbox.of(d2) == ["ack: SUCCESS"]
    assert world.effects == [("a", "charge", 1)]
    doc = world.job()
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    if fenced:
        assert world.inbox.of(d1) == ["drop: -"]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.ACKS_LOST) == 0
    else:
        assert world.inbox.of(d1) == ["ack: INVALID_ACK_ID"]  # the stale delivery acked
        assert a.wrapped.metrics.get(pubsub_worker.Counter.ACKS_LOST) == 1


# -- adoption: a newer delivery in this process waits for the running one --------------


@TWINS
def test_a_step_never_runs_in_two_deliveries_of_one_process_at_once(
    world: World, fenced: bool
) -> None:
    """The first delivery (D1, epoch 1) is held inside its step's function; the message
    comes back to the same worker (D2). D2 adopts D1: it waits, claims nothing, and once
    D1 completed the job it acks from the record, so the step ran once. Without the
    fence D2 takes the key and the job over at once (epoch 2) and runs the step while
    D1's run of it is still under way: the step's function runs twice."""
    paused = Hold()

    def charge(job: pubsub_worker.Job) -> None:
        if job.epoch == 1:
            paused.stop_here()
        world.effect("a", "charge", job.epoch)

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("charge", lambda: charge(job))

    a = world.node("a", handle)
    world.publish()
    d1 = world.inbox.next()
    late = a.deliver(d1)
    paused.wait_arrived()

    with switched_off("adoption", fenced):
        d2 = world.inbox.redeliver(d1)
        adopter = a.deliver(d2)
        time.sleep(0.5)
        if fenced:
            assert adopter.is_alive()  # waiting for D1, nothing claimed
            assert world.effects == []
        else:
            settled(adopter)  # took the job over and ran it meanwhile
        paused.release()
        settled(late, adopter)

    assert world.inbox.of(d2) == ["ack: SUCCESS"]
    assert world.inbox.of(d1) == ["drop: -"]  # D1's ack id is stale either way
    doc = world.job()
    if fenced:
        assert world.effects == [("a", "charge", 1)]
        assert (doc["status"], doc["epoch"], step_epochs(doc)) == ("completed", 1, {"charge": 1})
    else:
        assert world.effects == [("a", "charge", 2), ("a", "charge", 1)]  # ran twice
        assert (doc["status"], doc["epoch"], step_epochs(doc)) == ("completed", 2, {"charge": 2})


@TWINS
def test_a_delivery_given_up_stops_at_its_next_boundary(world: World, fenced: bool) -> None:
    """A job makes no progress for a whole lease (10 s here): the lease keeper gives its
    delivery up (drops it: Pub/Sub may hand the message to another worker). Let go, the
    handler reaches ``job.heartbeat()`` and stops there, without an ack. Without the
    fence, the given-up delivery runs on, runs its step and acks, while the message it
    let go of may be running elsewhere."""
    paused = Hold()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        paused.stop_here()
        job.heartbeat()
        world.effect("a", "after heartbeat", job.epoch)
        job.step("charge", lambda: world.effect("a", "charge", job.epoch))

    a = world.node("a", handle, lease_seconds=10)
    world.publish()
    delivery = world.inbox.next()
    late = a.deliver(delivery)
    paused.wait_arrived()
    # Renewed once (the claim was progress), then given up by the lease keeper.
    kept_then_given_up = ["deadline 10: SUCCESS", "drop: -"]
    deadline = time.monotonic() + 3 * 10
    while world.inbox.of(delivery) != kept_then_given_up:
        assert time.monotonic() < deadline, world.inbox.of(delivery)
        time.sleep(0.1)

    with switched_off("generation", fenced):
        paused.release()
        settled(late)

    assert a.wrapped.metrics.get(pubsub_worker.Counter.STALLED) == 1
    if fenced:
        assert world.effects == []
        assert world.inbox.of(delivery) == [*kept_then_given_up, "drop: -"]  # never acked
        assert world.job()["status"] == "running"  # its lease runs out; a redelivery claims it
    else:
        assert world.effects == [("a", "after heartbeat", 1), ("a", "charge", 1)]
        assert world.inbox.of(delivery) == [*kept_then_given_up, "ack: SUCCESS"]
        assert world.job()["status"] == "completed"


# -- durable-ack: the ack only once the completion is durable ---------------------------


@TWINS
def test_the_ack_waits_for_the_durable_completion(world: World, fenced: bool) -> None:
    """One job, one step. When the worker acks, Pub/Sub's answer is final: the job
    document must say ``completed`` already (read back from Firestore as the ack is
    sent). Without the fence, the ack goes out while the job is still running: a crash
    there would lose the job with its message acked."""
    a = world.node("a", steps_handler(world, "a"))
    world.publish()
    delivery = world.inbox.next()
    with switched_off("durable-ack", fenced):
        settled(a.deliver(delivery))

    (ack,) = [t for t in world.inbox.told if t.ack_id == delivery.ack_id]
    assert (ack.what, ack.answer) == ("ack", "SUCCESS")
    assert ack.status == ("completed" if fenced else "running")
    assert world.job()["status"] == "completed"
    assert world.effects == [("a", "charge", 1)]


# -- outbox: unsent entries are published before the completion -------------------------


@pytest.fixture
def output(world: World) -> Iterator[tuple[str, str]]:
    """A topic path (not created yet) and the path of a subscription to make on it."""
    project = world.emulators.project
    topic = f"projects/{project}/topics/{unique_id('out')}"
    subscription = f"projects/{project}/subscriptions/{unique_id('out')}"
    yield topic, subscription
    deletes: list[Callable[[], object]] = [
        lambda: world.subscriber.delete_subscription(request={"subscription": subscription}),
        lambda: world.publisher.delete_topic(request={"topic": topic}),
    ]
    for delete in deletes:
        try:
            delete()
        except Exception:
            pass  # never made: the scenario did not get that far


@TWINS
def test_a_job_completes_only_once_its_outbox_is_sent(
    world: World, fenced: bool, output: tuple[str, str]
) -> None:
    """A step publishes through the outbox to a topic that does not exist yet: the
    entry is committed with the step, its publish fails. The handler returns; the
    completion first publishes what is unsent, fails again, and the job is released
    (the message deferred, not acked). Once the topic exists, the redelivery publishes
    the entry, once, then completes. Without the fence, the job is completed (and its
    message acked) with the entry never sent."""
    topic, subscription = output

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def produce() -> str:
            world.effect("a", "produce", job.epoch)
            job.publish(topic, b"output", source="fences")
            return "produced"

        job.step("produce", produce)

    a = world.node("a", handle)
    world.publish()
    first = world.inbox.next()
    with switched_off("outbox", fenced):
        settled(a.deliver(first))

    doc = world.job()
    ((entry_id, entry),) = doc["outbox"].items()
    assert entry["sent"] is False
    assert world.effects == [("a", "produce", 1)]
    if not fenced:
        assert doc["status"] == "completed"  # completed with its entry unsent
        assert world.inbox.of(first) == ["ack: SUCCESS"]
        return
    assert doc["status"] == "released"
    assert world.inbox.of(first) == ["deadline 10: SUCCESS", "drop: -"]  # deferred, not acked

    world.publisher.create_topic(request={"name": topic})
    world.subscriber.create_subscription(request={"name": subscription, "topic": topic})
    second = world.inbox.redeliver(first)
    settled(a.deliver(second))

    doc = world.job()
    assert (doc["status"], doc["epoch"], doc["outbox"][entry_id]["sent"]) == ("completed", 2, True)
    assert world.inbox.of(second) == ["ack: SUCCESS"]
    assert world.effects == [("a", "produce", 1)]
    outputs = drain_messages(world.subscriber, subscription, quiet_s=1.0)
    assert [(m.data, m.attributes["effect_key"]) for m in outputs] == [
        (b"output", "op-1:produce:0")
    ]
