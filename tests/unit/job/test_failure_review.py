"""The failure path's order, on the in-memory store: the failed record, then the review.

A claimed job's failed record is written (fenced, ``review: pending``)
before its failure message is published, then marked ``review: sent``. So
an owner that lost the job before that write publishes nothing for review
(the window the protocol's model found in the old order: publish, then
record), and a delivery that finds the job failed with its review pending
publishes the failure message before it acks.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest
from google.api_core.exceptions import NotFound

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker._job.lease import now_utc
from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops import jobs_view
from pubsub_worker.errors import PermanentError
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores import base as s
from tests.support.job_documents import put_job
from tests.support.world import FAILURES, SUB, FakeMessage, FlakyStore, World, world

__all__ = ["world"]

DOC = document_id(SUB, "k")


class Counting:
    """A handler that raises ``PermanentError`` on every run, and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, message: Any, job: pubsub_worker.Job) -> None:
        self.runs += 1
        raise PermanentError("never")


class TakenOver(Hooks):
    """At the failure path, another worker claims the job: the owner's lease had lapsed."""

    def __init__(self) -> None:
        self.store: s.JobStore | None = None

    def before_review(self, key: str | None, message_id: str) -> None:
        assert self.store is not None
        snap = self.store.get(DOC)
        assert snap is not None
        now = now_utc()
        self.store.update(
            DOC,
            {
                (s.EPOCH,): snap.fields[s.EPOCH] + 1,
                (s.OWNER,): "another-worker",
                (s.DELIVERY,): "another-delivery",
                (s.LEASE_EXPIRES_AT,): now + timedelta(seconds=10),
                (s.UPDATED_AT,): now,
            },
            expected=snap.version,
        )


def test_an_owner_that_lost_the_job_before_its_failed_record_publishes_nothing(
    world: Callable[..., World],
) -> None:
    """The model's ``review-only-failed`` trail: the owner confirmed its ownership, then lost
    the job (a pause past its lease) before recording it failed. The new owner decides the
    job's fate; the old one publishes no failure message (the old order published one, for a
    job the new owner then completed)."""
    hooks = TakenOver()
    w = world(Counting(), hooks=hooks)
    hooks.store = w.store
    assert w.deliver(FakeMessage(op="k")) == "nack"  # still the current delivery: it comes back
    assert w.reviews() == []
    record = w.record()
    assert (record[s.STATUS], record[s.EPOCH], record[s.OWNER]) == ("running", 2, "another-worker")
    assert s.REVIEW not in record


def test_the_failed_record_is_durable_before_the_failure_message_and_marked_sent_after(
    world: Callable[..., World],
) -> None:
    handler = Counting()
    w = world(handler)
    seen: list[tuple[str, str | None]] = []
    publish = w.publisher.publish

    def watching(topic: str, data: bytes, **attributes: str) -> Future[str]:
        if topic == FAILURES:
            record = w.record()
            seen.append((record[s.STATUS], record.get(s.REVIEW)))
        return publish(topic, data, **attributes)

    w.publisher.publish = watching  # type: ignore[method-assign]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert seen == [("failed", "pending")]
    assert (w.record()[s.STATUS], w.record()[s.REVIEW]) == ("failed", "sent")
    assert len(w.reviews()) == 1
    assert handler.runs == 1


def test_a_failure_message_that_cannot_go_out_is_published_by_the_next_delivery(
    world: Callable[..., World],
) -> None:
    """The failure topic is down: the job is failed (it never runs again), its review pending;
    each redelivery tries the publish before it acks, and the first that succeeds marks it."""
    handler = Counting()
    w = world(handler)
    w.publisher.fail[FAILURES] = NotFound("topic deleted")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(op="k")) == "defer"
    assert (w.record()[s.STATUS], w.record()[s.REVIEW]) == ("failed", "pending")
    view = job_ops.show(w.store, SUB, "k")
    assert view is not None
    assert "review       pending: the failure message is not published yet" in (
        jobs_view.render_job(view)
    )
    assert w.deliver(FakeMessage(op="k")) == "defer"  # still down: not acked without it
    assert w.wrapped.metrics.get(pubsub_worker.Counter.FAILURE_PATH_ERRORS) == 2
    del w.publisher.fail[FAILURES]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert (w.record()[s.STATUS], w.record()[s.REVIEW]) == ("failed", "sent")
    (review,) = w.reviews()
    assert (review["pubsub_worker_key"], review["pubsub_worker_reason"]) == ("k", "permanent")
    assert review["pubsub_worker_attempts"] == "1"
    assert handler.runs == 1
    assert w.deliver(FakeMessage(op="k")) == "ack"  # sent: a later copy publishes nothing
    assert len(w.reviews()) == 1


def test_a_pending_review_goes_out_only_with_the_job_s_own_payload(
    world: Callable[..., World],
) -> None:
    """A message reusing the key for another payload is a conflict of its own: it must not
    publish the failed job's pending failure message with its (different) data."""
    w = world(Counting())
    w.publisher.fail[FAILURES] = NotFound("topic deleted")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(b"first", op="k")) == "defer"
    del w.publisher.fail[FAILURES]
    assert w.deliver(FakeMessage(b"other", op="k")) == "ack"
    assert [(data, a["pubsub_worker_reason"]) for topic, data, a in w.publisher.sent] == [
        (b"other", "payload_conflict")
    ]
    assert w.record()[s.REVIEW] == "pending"
    assert w.deliver(FakeMessage(b"first", op="k")) == "ack"
    assert [(data, a["pubsub_worker_reason"]) for topic, data, a in w.publisher.sent] == [
        (b"other", "payload_conflict"),
        (b"first", "permanent"),
    ]
    assert w.record()[s.REVIEW] == "sent"


def test_a_replay_between_the_publish_and_its_mark_is_left_alone(
    world: Callable[..., World],
) -> None:
    """The mark is conditioned on the failed record's version: a replay that reset the job
    meanwhile is not written over (its run is reviewed afresh if it fails again)."""
    w = world(Counting())
    publish = w.publisher.publish
    replayed: list[FakeMessage] = []

    def replaying(topic: str, data: bytes, **attributes: str) -> Future[str]:
        if topic == FAILURES and not replayed:
            replayed.append(w.replay())  # the operator, between the publish and its mark
        return publish(topic, data, **attributes)

    w.publisher.publish = replaying  # type: ignore[method-assign]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    record = w.record()
    assert (record[s.STATUS], record[s.REVIEW]) == ("released", None)
    assert len(replayed) == 1


def test_a_mark_refused_by_a_write_that_left_the_failure_as_it_was_is_written_again(
    world: Callable[..., World],
) -> None:
    """The protocol's model found it: a writer that moves the version and leaves the failure
    as it was (an edit by hand, changing no owner) between the publish and its mark. Refused,
    the mark is read again and written on the version read, not left pending for good with its
    message out."""
    w = world(Counting())
    publish = w.publisher.publish

    def editing(topic: str, data: bytes, **attributes: str) -> Future[str]:
        if topic == FAILURES:
            snap = w.store.get(DOC)
            assert snap is not None
            w.store.update(DOC, {("note",): "looked at"}, expected=snap.version)
        return publish(topic, data, **attributes)

    w.publisher.publish = editing  # type: ignore[method-assign]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert (w.record()[s.STATUS], w.record()[s.REVIEW]) == ("failed", "sent")
    assert len(w.reviews()) == 1


def test_a_replay_clears_the_review_and_a_new_failure_is_reviewed_again(
    world: Callable[..., World],
) -> None:
    handler = Counting()
    w = world(handler)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    again = w.replay()
    assert w.record()[s.REVIEW] is None
    assert w.deliver(again) == "ack"
    assert (w.record()[s.STATUS], w.record()[s.REVIEW]) == ("failed", "sent")
    assert len(w.reviews()) == 2
    assert handler.runs == 2


@pytest.mark.parametrize("topic", [None, FAILURES], ids=["no-failure-topic", "failure-topic"])
def test_the_review_field_is_written_only_when_a_failure_message_follows(
    topic: str | None, world: Callable[..., World]
) -> None:
    w = world(Counting(), failure_topic=topic)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.record()[s.STATUS] == "failed"
    assert w.record().get(s.REVIEW) == (None if topic is None else "sent")
    assert len(w.reviews()) == (0 if topic is None else 1)


def test_a_pending_review_found_without_a_failure_topic_is_never_acked(
    world: Callable[..., World], caplog: pytest.LogCaptureFixture
) -> None:
    """The worker that failed the job had a failure topic; this one has none (a change of
    configuration): the message is not acked without its failure message. It is deferred with
    a backoff (never a loop), and the log names the variable to set."""
    w = world(Counting(), failure_topic=None)
    record = {
        s.KEY: "k",
        s.SUBSCRIPTION: SUB,
        s.STATUS: "failed",
        s.EPOCH: 1,
        s.ATTEMPTS: 1,
        s.REASON: "permanent",
        s.ERROR: "never",
        s.REVIEW: "pending",
    }
    w.store.create(DOC, record)
    message = FakeMessage(op="k")
    assert w.deliver(message) == "defer"
    assert message.actions[0] == "deadline 10"  # a backoff, not a hot loop
    assert "PUBSUB_WORKER_FAILURE_TOPIC is not set now" in caplog.text
    assert w.record()[s.REVIEW] == "pending"


def test_a_worker_without_a_failure_topic_refuses_to_start_while_reviews_are_pending() -> None:
    """Failed jobs recorded ``review: pending`` under a failure topic that is unset now:
    the worker names the variable at start-up instead of deferring their messages forever."""
    store = FlakyStore()
    put_job(store, SUB, "k", s.Status.FAILED, review="pending")
    with pytest.raises(pubsub_worker.ConfigError, match="PUBSUB_WORKER_FAILURE_TOPIC is not set"):
        World(Counting(), store=store, failure_topic=None)
    settled = FlakyStore()
    put_job(settled, SUB, "k", s.Status.FAILED, review="sent")
    World(Counting(), store=settled, failure_topic=None).close()  # nothing pending: it starts
