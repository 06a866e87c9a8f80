"""The operator's release aimed at an epoch, on its own: the expect-epoch fence.

As in ``test_fences.py`` (its harness: real deliveries pulled one at a time,
workers in this process on the real emulators, a delivery held at a named
point). The race is the protocol model's ``release-aimed`` trail: the
operator looks at a job (``jobs show``), then releases the claim it saw with
``jobs release --expect-epoch``; meanwhile a healthy owner claimed the job.
With every fence on, the release is refused and that owner completes; with
the expect-epoch fence switched off, the release lands on it.
"""

from __future__ import annotations

from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._ops.jobs import ReleaseOutcome

from .test_fences import TWINS, Hold, World, settled, switched_off, world

__all__ = ["world"]

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


@TWINS
def test_a_release_aimed_at_an_epoch_spares_a_later_owner(world: World, fenced: bool) -> None:
    """The job's first attempt fails: released at epoch 1, which the operator sees. The
    message comes back to B, which claims it (epoch 2) and is held inside its step. The
    operator's `jobs release --expect-epoch 1`, aimed at what it saw, is refused: let go,
    B completes and acks. Without the fence, the release lands on B's healthy claim
    (epoch 3): B's commit is refused, the job is left released, its message nacked."""
    inside = Hold()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails")

        def charge() -> str:
            world.effect("b", "charge", job.epoch)
            inside.stop_here()
            return "charged"

        job.step("charge", charge)

    a = world.node("a", handle)
    b = world.node("b", handle)
    world.publish()
    settled(a.deliver(world.inbox.next()))  # attempt 1 fails: released, nacked
    shown = world.job()
    assert (shown["status"], shown["epoch"]) == ("released", 1)  # what `jobs show` shows
    again = world.inbox.next()
    running = b.deliver(again)
    inside.wait_arrived()  # B claimed the job (epoch 2) and runs its step

    with switched_off("expect-epoch", fenced):
        result = world.release_job(expect_epoch=shown["epoch"])
    inside.release()
    settled(running)

    doc = world.job()
    assert world.effects == [("b", "charge", 2)]
    if fenced:
        assert (result.kind, result.epoch) == (ReleaseOutcome.REFUSED, 2)
        assert "at epoch 2, not 1" in result.detail
        assert world.inbox.of(again) == ["ack: SUCCESS"]
        assert (doc["status"], doc["epoch"]) == ("completed", 2)
    else:
        assert (result.kind, result.epoch) == (ReleaseOutcome.RELEASED, 3)  # B's claim, released
        assert world.inbox.of(again) == ["nack: SUCCESS"]  # its commit refused: not its job
        assert b.wrapped.metrics.get(pubsub_worker.Counter.STALE_COMMITS) == 1
        assert (doc["status"], doc["epoch"]) == ("released", 3)
