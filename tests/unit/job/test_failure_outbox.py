"""The failure path and the outbox, on the in-memory store: unit tests of the order.

A job sent to review first confirms it still owns its document (a fenced
write), then publishes the outbox entries its committed steps left unsent,
then publishes for review and records ``failed``. A stale owner stops at the
first write and publishes nothing; an entry that still cannot be published
stays unsent in the failed record, for the replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.api_core.exceptions import NotFound, ServiceUnavailable

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops import jobs_view
from pubsub_worker.errors import PermanentError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Reason
from tests.support.world import SUB, FakeMessage, World, world

__all__ = ["world"]

OUTPUT = "projects/p/topics/output"


def published_to(w: World, topic: str) -> list[dict[str, str]]:
    return [attrs for to, _, attrs in w.publisher.sent if to == topic]


def outbox_of(w: World) -> list[tuple[str, bool]]:
    return sorted((e["effect_key"], e["sent"]) for e in (w.record().get(s.OUTBOX) or {}).values())


@pytest.mark.parametrize(
    ("error", "reason"),
    [(PermanentError("cannot go on"), Reason.PERMANENT), (RuntimeError("boom"), Reason.ATTEMPTS)],
    ids=["permanent", "last-attempt"],
)
def test_entries_left_unsent_are_published_before_the_review(
    error: Exception, reason: str, world: Callable[..., World]
) -> None:
    """The step's publish failed (it committed: its effect happened); the failure path
    publishes it, with its effect key, before the failure message, and records it sent."""

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("produce", lambda: job.publish(OUTPUT, b"out", source="test"))
        w.publisher.fail.pop(OUTPUT)  # the output topic is back
        raise error

    w = world(handle, max_attempts=1)
    w.publisher.fail[OUTPUT] = ServiceUnavailable("down")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert [topic for topic, _, _ in w.publisher.sent] == [OUTPUT, "projects/p/topics/failures"]
    assert [a["effect_key"] for a in published_to(w, OUTPUT)] == ["k:produce:0"]
    assert outbox_of(w) == [("k:produce:0", True)]
    record = w.record()
    assert (record["status"], record["reason"], record["attempts"]) == ("failed", reason, 1)
    assert len(w.reviews()) == 1


def test_an_entry_that_still_cannot_be_published_stays_unsent_in_the_failed_record(
    world: Callable[..., World],
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("produce", lambda: job.publish(OUTPUT, b"out", source="test"))
        raise PermanentError("cannot go on")

    w = world(handle)
    w.publisher.fail[OUTPUT] = NotFound("no such topic")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert published_to(w, OUTPUT) == []
    assert outbox_of(w) == [("k:produce:0", False)]
    assert w.record()["status"] == "failed"
    assert len(w.reviews()) == 1


def test_jobs_show_lists_the_unsent_entry_and_the_replay_publishes_it_before_the_handler(
    world: Callable[..., World],
) -> None:
    runs: list[int] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        runs.append(job.epoch)
        job.step("produce", lambda: job.publish(OUTPUT, b"out", source="test"))
        raise PermanentError("cannot go on")

    w = world(handle)
    w.publisher.fail[OUTPUT] = NotFound("no such topic")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(b"payload", op="k")) == "ack"

    view = job_ops.show(w.store, SUB, "k")
    assert view is not None
    assert [entry.effect_key for entry in view.unsent] == ["k:produce:0"]
    text = jobs_view.render_job(view)
    assert "step produce  -> projects/p/topics/output  3 B  NOT SENT (published on replay)" in text
    assert (
        "unsent       1 outbox entry of committed steps not published; published, with the "
        "same effect keys, when the job is replayed (pubsub-worker jobs replay k)"
    ) in text

    del w.publisher.fail[OUTPUT]  # the output topic exists now
    assert w.deliver(w.replay()) == "ack"

    assert runs == [1, 3]  # epoch 2 is the replay's reset; the step is skipped at epoch 3
    assert [a["effect_key"] for a in published_to(w, OUTPUT)] == ["k:produce:0"]
    assert outbox_of(w) == [("k:produce:0", True)]
    assert [topic for topic, _, _ in w.publisher.sent] == [
        "projects/p/topics/failures",
        OUTPUT,  # by the replayed message's claim, before its handler ran
        "projects/p/topics/failures",
    ]
    view = job_ops.show(w.store, SUB, "k")
    assert view is not None
    assert view.unsent == ()
    assert "unsent  " not in jobs_view.render_job(view)


def test_a_stale_owner_s_permanent_error_publishes_nothing_for_review(
    world: Callable[..., World],
) -> None:
    """Another writer moved the job on (here a replay's reset: a new epoch) while the
    handler ran. The failure path's fenced write is refused before any publish."""

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        doc_id = document_id(SUB, "k")
        snap = w.store.get(doc_id)
        assert snap is not None
        w.store.update(
            doc_id,
            {(s.STATUS,): "released", (s.EPOCH,): job.epoch + 1},
            expected=snap.version,
        )
        raise PermanentError("cannot go on")

    w = world(handle)
    outcome = w.deliver(FakeMessage(op="k"))
    assert outcome in ("nack", "drop")  # lost ownership: never acked, never reviewed
    assert w.reviews() == []
    record = w.record()
    assert (record["status"], record["epoch"]) == ("released", 2)
    assert "failed_at" not in record


def test_a_stale_owner_publishes_no_unsent_entry_either(world: Callable[..., World]) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("produce", lambda: job.publish(OUTPUT, b"out", source="test"))
        w.publisher.fail.pop(OUTPUT)
        doc_id = document_id(SUB, "k")
        snap = w.store.get(doc_id)
        assert snap is not None
        w.store.update(doc_id, {(s.EPOCH,): job.epoch + 1}, expected=snap.version)
        raise PermanentError("cannot go on")

    w = world(handle)
    w.publisher.fail[OUTPUT] = ServiceUnavailable("down")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(op="k")) in ("nack", "drop")
    assert w.publisher.sent == []
    assert outbox_of(w) == [("k:produce:0", False)]  # the new owner publishes it
