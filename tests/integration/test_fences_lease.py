"""The claim's wait for another owner's live lease, on its own: the live-lease fence.

As in ``test_fences.py`` (its harness: real deliveries pulled one at a time,
workers in this process on the real emulators, a delivery held at a named
point): one worker runs the job and is held inside its step, its lease live;
a second message of the key reaches another worker, whose claim finds that
lease. With every fence on, the claim waits for it and finds the job done;
with the live-lease fence switched off, it takes the running job over.
"""

from __future__ import annotations

from typing import Any

import pytest

import pubsub_worker

from .test_fences import TWINS, Hold, World, settled, switched_off, world

__all__ = ["world"]

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


@TWINS
def test_a_claim_waits_for_another_owner_s_live_lease(world: World, fenced: bool) -> None:
    """A runs the job (epoch 1) and is held inside its step, its lease live (300 s). A
    second message of the key reaches B, whose claim reads the running job and is held
    there, then let go: it finds A's live lease and waits (it polls, once a second). A is
    let go and completes; B's next poll finds the job completed: it acks without running
    anything. Without the fence, B's claim takes the job over at once (epoch 2) and runs
    the step while A is still inside it: the step runs twice at once, and A's commit is
    refused."""
    inside = Hold()

    def handler(name: str) -> Any:
        def handle(message: Any, job: pubsub_worker.Job) -> None:
            def charge() -> str:
                world.effect(name, "charge", job.epoch)
                if name == "a":
                    inside.stop_here()
                return "charged"

            job.step("charge", charge)

        return handle

    a = world.node("a", handler("a"))
    b = world.node("b", handler("b"))
    world.publish()
    first = world.inbox.next()
    late = a.deliver(first)
    inside.wait_arrived()
    world.publish()
    second = world.inbox.next()
    read = b.store.hold("read")
    waiting = b.deliver(second)
    read.wait_arrived()  # B's claim read the job: running, A's lease live

    with switched_off("live-lease", fenced):
        read.release()
        if not fenced:
            settled(waiting)  # B took the job over, ran the step and completed it
        inside.release()
        settled(late, waiting)

    doc = world.job()
    assert world.inbox.of(second) == ["ack: SUCCESS"]
    if fenced:
        assert world.effects == [("a", "charge", 1)]
        assert world.inbox.of(first) == ["ack: SUCCESS"]
        assert b.wrapped.metrics.get(pubsub_worker.Counter.ALREADY_DONE) == 1
        assert b.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 0
        assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    else:
        assert world.effects == [("a", "charge", 1), ("b", "charge", 2)]  # twice, at once
        assert world.inbox.of(first) == ["nack: SUCCESS"]  # A's commit was refused
        assert a.wrapped.metrics.get(pubsub_worker.Counter.STALE_COMMITS) == 1
        assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 2)
