"""The failure path's review mark on its own: the review-mark fence.

As in ``test_fences.py`` (its harness: real deliveries pulled one at a time,
workers in this process on the real emulators, a delivery held at a named
point). The race is the one the protocol's model found for a mark without
its version condition (docs/protocol.md, mutant ``owner-mark-unconditioned``):
an owner publishes its job's failure message and is held before it marks the
review sent; meanwhile the job is replayed and fails again, and the second
failure's message does not go out. With every fence on, the stale mark is
refused and the second failure's message is published by the next delivery;
with the review-mark fence switched off, the stale mark lands and that
message never goes out.
"""

from __future__ import annotations

from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle, drain_messages, unique_id

from .test_fences import TWINS, World, settled, switched_off, world

__all__ = ["world"]

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]


def never(message: Any, job: pubsub_worker.Job) -> None:
    """A handler whose every run is a permanent failure: the job goes to review."""
    raise pubsub_worker.PermanentError("this job can never succeed")


@TWINS
def test_a_stale_review_mark_never_hides_a_later_failure(
    world: World, fenced: bool, make_subscription: Any
) -> None:
    """A fails the job (epoch 1), publishes its failure message and is held before its
    mark. The operator replays the job (epoch 2); B runs the replayed message, fails it
    again (epoch 3, review pending) and cannot publish (its failure topic is gone). A is
    let go: its mark, conditioned on its failed record's version, is refused, and read
    again the record is another failure: left pending. C gets the replayed message again,
    finds the review pending, publishes it and acks: two failure messages, one per
    failure. Without the fence, A's mark lands on the second failure: C finds it marked
    sent and acks, and the second failure's message never goes out."""
    failures: SubscriptionHandle = make_subscription(exactly_once=False)
    gone = f"projects/{world.emulators.project}/topics/{unique_id('gone')}"
    a = world.node("a", never, failure_topic=failures.topic_path)
    b = world.node("b", never, failure_topic=gone)
    c = world.node("c", never, failure_topic=failures.topic_path)
    mark = a.store.hold("mark")
    world.publish()
    first = world.inbox.next()
    late = a.deliver(first)
    mark.wait_arrived()  # A's failure message is out; its mark is held
    world.replay_job()
    replayed = world.inbox.next()
    settled(b.deliver(replayed))
    # B could not publish: its message deferred (not acked), the review left pending.
    assert world.inbox.of(replayed) == ["deadline 10: SUCCESS", "drop: -"]
    assert b.wrapped.metrics.get(pubsub_worker.Counter.FAILURE_PATH_ERRORS) == 1
    doc = world.job()
    assert (doc["status"], doc["epoch"], doc["review"]) == ("failed", 3, "pending")

    with switched_off("review-mark", fenced):
        mark.release()
        settled(late)

    assert world.inbox.of(first) == ["ack: SUCCESS"]  # A's failure message went out
    assert world.job()["review"] == ("pending" if fenced else "sent")
    again = world.inbox.redeliver(replayed)
    settled(c.deliver(again))

    assert world.inbox.of(again) == ["ack: SUCCESS"]
    assert world.job()["review"] == "sent"
    sent = drain_messages(world.subscriber, failures.subscription_path, quiet_s=1.0)
    reviewed = sorted(m.attributes["pubsub_worker_message_id"] for m in sent)
    if fenced:
        assert reviewed == sorted([first.message_id, replayed.message_id])  # one per failure
    else:
        assert reviewed == [first.message_id]  # the second failure is never reviewed
