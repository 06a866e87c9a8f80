"""The fences of the owner's writes on their own: the commit's precondition, the transaction's.

As in ``test_fences.py`` (its harness: real deliveries pulled one at a time,
workers in this process on the real emulators, a delivery held at a named
point): the owner (A) is held while an operator releases the job (``jobs
release``: the epoch moves on) and another worker (B) claims it and
completes it; then A is let go. With every fence on, A's late write is
refused; with that one fence switched off, it lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from google.cloud import firestore

import pubsub_worker
from emulator import unique_id
from tests.support.observe import step_epochs

from .test_fences import TWINS, Hold, World, settled, switched_off, world

__all__ = ["world"]

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


# -- commit: the version precondition of the owner's writes ----------------------------


@TWINS
def test_a_stale_owner_s_commit_is_refused(world: World, fenced: bool) -> None:
    """The owner (A, epoch 1) is held inside step b while it is released (epoch 2) and
    another worker (B) claims the job (epoch 3), runs b and completes it. Let go, A's
    step function ends (it was running: at least once), and its record of b and its
    completion are refused by the version precondition: no commit, no ack. Without
    the fence, A's stale record of b lands over B's, and A completes the job again."""
    inside_b = Hold()

    def handler(name: str) -> Callable[[Any, pubsub_worker.Job], None]:
        def handle(message: Any, job: pubsub_worker.Job) -> None:
            job.step("a", lambda: world.effect(name, "a", job.epoch))

            def b() -> None:
                if name == "a":
                    inside_b.stop_here()
                world.effect(name, "b", job.epoch)

            job.step("b", b)

        return handle

    a = world.node("a", handler("a"))
    b = world.node("b", handler("b"))
    world.publish()
    first = world.inbox.next()
    late = a.deliver(first)
    inside_b.wait_arrived()
    assert world.release_job().ok
    world.publish()
    second = world.inbox.next()
    settled(b.deliver(second))

    with switched_off("commit", fenced):
        inside_b.release()
        settled(late)

    assert world.effects == [("a", "a", 1), ("b", "b", 3), ("a", "b", 1)]
    assert world.inbox.of(second) == ["ack: SUCCESS"]
    doc = world.job()
    assert (doc["status"], doc["epoch"]) == ("completed", 3)
    if fenced:
        assert step_epochs(doc) == {"a": 1, "b": 3}
        assert world.inbox.of(first) == ["nack: SUCCESS"]  # no ack: it was not the owner
        assert a.wrapped.metrics.get(pubsub_worker.Counter.STALE_COMMITS) == 1
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 0
    else:
        assert step_epochs(doc) == {"a": 1, "b": 1}  # the stale record landed
        assert world.inbox.of(first) == ["ack: SUCCESS"]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 1


# -- transaction: the job's version checked inside the transactional step --------------


def transactional_handler(world: World, name: str, sink: str, hold: Hold, flavour: str) -> Any:
    """A transactional step ``write`` adding a sink document; ``a`` is held before it."""
    if flavour == "sync":

        def handle(message: Any, job: pubsub_worker.Job) -> None:
            if name == "a":
                hold.stop_here()  # before the transaction: a pause here holds no lock

            def write(transaction: Any) -> str:
                ref = world.firestore_client.collection(sink).document()
                transaction.set(ref, {"node": name, "epoch": job.epoch})
                return str(ref.id)

            job.transactional_step("write", write)

        return handle
    clients: list[firestore.AsyncClient] = []

    async def ahandle(message: Any, job: pubsub_worker.AsyncJob) -> None:
        if name == "a":
            await asyncio.to_thread(hold.stop_here)
        if not clients:
            clients.append(firestore.AsyncClient(project=world.emulators.project))

        async def write(transaction: Any) -> str:
            ref = clients[0].collection(sink).document()
            transaction.set(ref, {"node": name, "epoch": job.epoch})
            return str(ref.id)

        await job.transactional_step("write", write)

    return ahandle


@TWINS
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_stale_owner_s_transaction_never_lands(world: World, fenced: bool, flavour: str) -> None:
    """The owner (A, epoch 1) is held before its transactional step while it is released
    and another worker (B) claims the job (epoch 3), writes the sink in its transaction
    and completes. Let go, A's transaction reads the job at another version: nothing
    of it lands, A stops without an ack. Without the fence, A's business write and its
    stale step record commit, and A completes the job again."""
    sink = unique_id("sink")
    before = Hold()
    a = world.node("a", transactional_handler(world, "a", sink, before, flavour))
    b = world.node("b", transactional_handler(world, "b", sink, before, flavour))
    world.publish()
    first = world.inbox.next()
    late = a.deliver(first)
    before.wait_arrived()
    assert world.release_job().ok
    world.publish()
    second = world.inbox.next()
    settled(b.deliver(second))

    with switched_off("transaction", fenced):
        before.release()
        settled(late)

    written = sorted(
        (d["node"], d["epoch"])
        for d in (x.to_dict() for x in world.firestore_client.collection(sink).stream())
    )
    doc = world.job()
    assert (doc["status"], doc["epoch"]) == ("completed", 3)
    assert world.inbox.of(second) == ["ack: SUCCESS"]
    if fenced:
        assert written == [("b", 3)]
        assert step_epochs(doc) == {"write": 3}
        assert world.inbox.of(first) == ["nack: SUCCESS"]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 0
    else:
        assert written == [("a", 1), ("b", 3)]  # the stale owner's business write landed
        assert step_epochs(doc) == {"write": 1}
        assert world.inbox.of(first) == ["ack: SUCCESS"]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 1
