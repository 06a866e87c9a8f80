"""The outcome matrix: every way a delivery can end maps to one tested outcome.

Two layers. ``decide`` is pure and is tested as a table. Then the whole
wrapper runs on the in-memory store with a fake message and a fake
publisher: for each phase, each exception a handler or the store can raise
there, and the test checks what Pub/Sub was told (ack, nack, a deferral, a
drop), what the job record says, and what was published for review.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from google.api_core.exceptions import NotFound

import pubsub_worker
from pubsub_worker._job.claim import ClaimKind
from pubsub_worker._job.keys import document_id
from pubsub_worker._support.metrics import Metrics
from pubsub_worker._worker.outcome import (
    Decision,
    Happened,
    Outcome,
    Phase,
    backoff_s,
    decide,
    decided,
)
from pubsub_worker._worker.settle import settle
from pubsub_worker.errors import (
    DocumentTooLarge,
    FailurePathUnavailable,
    InvalidMessage,
    LimitExceeded,
    LostOwnership,
    OutboxUnsent,
    PermanentError,
    ProcessingTimeout,
    ShuttingDown,
    StoreError,
    VersionConflict,
)
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Reason
from tests.support.world import FAILURES, SUB, FakeMessage, World

# -- decide(), the pure table -----------------------------------------------------

CASES: list[tuple[str, Happened, int, Outcome, str | None]] = [
    # name, what happened, attempts, outcome, failure-path reason
    (
        "receipt ok cannot start",
        Happened(Phase.RECEIPT, StoreError("down")),
        0,
        Outcome.DEFER,
        None,
    ),
    (
        "missing key",
        Happened(Phase.RECEIPT, InvalidMessage("no op")),
        0,
        Outcome.REVIEW,
        "missing_key",
    ),
    ("stale before claim", Happened(Phase.RECEIPT, None, current=False), 0, Outcome.DROP, None),
    ("gate timeout", Happened(Phase.GATE), 0, Outcome.DEFER, None),
    ("gate superseded", Happened(Phase.GATE, current=False), 0, Outcome.DROP, None),
    ("completed", Happened(Phase.CLAIM, claim=ClaimKind.COMPLETED), 0, Outcome.ACK, None),
    ("failed", Happened(Phase.CLAIM, claim=ClaimKind.FAILED), 0, Outcome.ACK, None),
    (
        "conflict",
        Happened(Phase.CLAIM, claim=ClaimKind.CONFLICT),
        0,
        Outcome.REVIEW,
        "payload_conflict",
    ),
    ("busy", Happened(Phase.CLAIM, claim=ClaimKind.BUSY, busy_for_s=42), 0, Outcome.DEFER, None),
    ("store down", Happened(Phase.CLAIM, StoreError("x")), 0, Outcome.DEFER, None),
    ("claimed", Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED), 3, Outcome.RUN, None),
    ("claimed at the cap", Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED), 5, Outcome.RUN, None),
    (
        "claimed past it",
        Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED),
        6,
        Outcome.REVIEW,
        "attempts",
    ),
    (
        "earlier outbox unsent",
        Happened(Phase.CLAIM, OutboxUnsent("x"), claim=ClaimKind.CLAIMED),
        6,
        Outcome.RELEASE,
        None,
    ),
    ("lost at claim", Happened(Phase.CLAIM, LostOwnership("x")), 1, Outcome.NACK, None),
    ("returned", Happened(Phase.RUN), 1, Outcome.COMPLETE, None),
    ("returned at the last attempt", Happened(Phase.RUN), 5, Outcome.COMPLETE, None),
    ("error", Happened(Phase.RUN, ValueError("x")), 1, Outcome.RETRY, None),
    (
        "error at the last attempt",
        Happened(Phase.RUN, ValueError("x")),
        5,
        Outcome.REVIEW,
        "attempts",
    ),
    ("store error in a step", Happened(Phase.RUN, StoreError("x")), 1, Outcome.RETRY, None),
    ("cap", Happened(Phase.RUN, ProcessingTimeout("x")), 1, Outcome.RETRY, None),
    (
        "cap at the last attempt",
        Happened(Phase.RUN, ProcessingTimeout("x")),
        5,
        Outcome.REVIEW,
        "attempts",
    ),
    ("shutdown", Happened(Phase.RUN, ShuttingDown("x")), 5, Outcome.RELEASE, None),
    ("permanent", Happened(Phase.RUN, PermanentError("x")), 1, Outcome.REVIEW, "permanent"),
    ("too large", Happened(Phase.RUN, DocumentTooLarge("x")), 1, Outcome.REVIEW, "too_large"),
    ("over limits", Happened(Phase.RUN, LimitExceeded("x")), 1, Outcome.REVIEW, "limits"),
    ("lost, current", Happened(Phase.RUN, LostOwnership("x")), 1, Outcome.NACK, None),
    ("lost, stale", Happened(Phase.RUN, LostOwnership("x"), current=False), 1, Outcome.DROP, None),
    (
        "permanent, superseded: never published for review",
        Happened(Phase.RUN, PermanentError("x"), current=False),
        1,
        Outcome.DROP,
        None,
    ),
    (
        "error, superseded: no release",
        Happened(Phase.RUN, RuntimeError("x"), current=False),
        1,
        Outcome.DROP,
        None,
    ),
    (
        "ordering: an earlier message of its key is not done",
        Happened(Phase.ORDER, busy_for_s=25.0),
        0,
        Outcome.DEFER,
        None,
    ),
    (
        "claim while draining: not claimed",
        Happened(Phase.CLAIM, ShuttingDown("draining")),
        0,
        Outcome.NACK,
        None,
    ),
    (
        "completion: lost",
        Happened(Phase.COMPLETE, LostOwnership("x"), current=False),
        1,
        Outcome.DROP,
        None,
    ),
    ("completion: outbox", Happened(Phase.COMPLETE, OutboxUnsent("x")), 2, Outcome.RELEASE, None),
    ("completion: store", Happened(Phase.COMPLETE, StoreError("x")), 1, Outcome.DEFER, None),
    ("release: store", Happened(Phase.RELEASE, StoreError("x")), 1, Outcome.DEFER, None),
    ("release: lost", Happened(Phase.RELEASE, LostOwnership("x")), 1, Outcome.NACK, None),
    ("review: publish", Happened(Phase.REVIEW, NotFound("topic")), 6, Outcome.DEFER, None),  # type: ignore[no-untyped-call]
    (
        "review: nowhere",
        Happened(Phase.REVIEW, FailurePathUnavailable("x")),
        6,
        Outcome.DEFER,
        None,
    ),
    (
        "review: lost",
        Happened(Phase.REVIEW, LostOwnership("x"), current=False),
        6,
        Outcome.DROP,
        None,
    ),
]


@pytest.mark.parametrize(
    ("happened", "attempts", "outcome", "reason"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decide(happened: Happened, attempts: int, outcome: Outcome, reason: str | None) -> None:
    decision = decide(happened, attempts=attempts, max_attempts=5)
    assert decision.outcome is outcome
    assert decision.reason == reason
    if outcome is Outcome.DEFER:
        assert 10 <= decision.delay_s <= 600  # never a hot loop


@pytest.mark.parametrize("max_attempts", [1, 2, 5])
@pytest.mark.parametrize(
    "happened",
    [
        Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED),
        Happened(Phase.CLAIM, claim=ClaimKind.CLAIMED, current=False),
        Happened(Phase.CLAIM, ShuttingDown("stop"), claim=ClaimKind.CLAIMED),
        Happened(Phase.RUN),
        Happened(Phase.RUN, current=False),
        Happened(Phase.RUN, RuntimeError("boom")),
    ],
    ids=repr,
)
def test_the_decisions_built_once_are_the_tables(happened: Happened, max_attempts: int) -> None:
    for attempts in range(max_attempts + 3):
        fast = decide(happened, attempts=attempts, max_attempts=max_attempts)
        assert fast == decided(happened, attempts=attempts, max_attempts=max_attempts)


def test_every_outcome_and_phase_is_in_the_table() -> None:
    outcomes = {case[3] for case in CASES}
    phases = {case[1].phase for case in CASES}
    assert outcomes == set(Outcome)
    assert phases == set(Phase)


def test_a_busy_owner_defers_until_its_lease_ends_within_pubsub_bounds() -> None:
    def busy(seconds: float) -> float:
        happened = Happened(Phase.CLAIM, claim=ClaimKind.BUSY, busy_for_s=seconds)
        return decide(happened, attempts=0, max_attempts=5).delay_s

    assert (busy(0.5), busy(42), busy(4000)) == (10, 42, 600)


def test_backoff_doubles_and_is_bounded() -> None:
    assert [backoff_s(n) for n in (0, 1, 2, 3, 7, 50)] == [10, 10, 20, 40, 600, 600]


def test_each_outcome_says_if_it_acks_which_write_carries_it_out_and_if_it_is_success() -> None:
    lost = "LostOwnership"
    table = {o: (o.acks, o.write, o.fine, o.lost_error_type) for o in Outcome}
    assert table == {
        Outcome.RUN: (False, None, True, None),
        Outcome.COMPLETE: (True, Phase.COMPLETE, True, None),
        Outcome.RETRY: (False, Phase.RELEASE, False, None),
        Outcome.RELEASE: (False, Phase.RELEASE, False, None),
        Outcome.REVIEW: (True, Phase.REVIEW, False, None),
        Outcome.ACK: (True, None, True, None),
        Outcome.NACK: (False, None, False, lost),
        Outcome.DEFER: (False, None, False, None),
        Outcome.DROP: (False, None, False, lost),
    }


@pytest.mark.parametrize("delay_s", [0.0, 30.0])
def test_settle_acks_exactly_the_outcomes_that_say_they_ack(delay_s: float) -> None:
    for outcome in Outcome:
        message = FakeMessage()
        decision = Decision(outcome, "why", delay_s=delay_s)
        settle(decision, message, metrics=Metrics(), log=logging.getLogger("test"))
        assert (message.outcome == "ack") is outcome.acks, outcome


# -- the wrapper on the in-memory store ---------------------------------------------


def two_steps(message: Any, job: pubsub_worker.Job) -> None:
    job.step("a", lambda: 1)
    job.step("b", lambda: 2)


def test_returned_completes_then_acks(world: Callable[..., World]) -> None:
    w = world(two_steps)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.record()["status"] == "completed"
    assert w.store.writes == 3  # the claim, a before b runs, the completion with b


def test_missing_key_goes_to_review_and_acks(world: Callable[..., World]) -> None:
    w = world(two_steps)
    assert w.deliver(FakeMessage()) == "ack"
    assert [r["pubsub_worker_reason"] for r in w.reviews()] == ["missing_key"]


def test_a_message_without_exactly_once_is_deferred(world: Callable[..., World]) -> None:
    w = world(two_steps)
    message = FakeMessage(op="k")
    message.exactly_once_enabled = False
    assert w.deliver(message) == "defer"
    assert w.store.writes == 0


def test_completed_job_is_acked_without_running(world: Callable[..., World]) -> None:
    runs: list[int] = []
    w = world(lambda message, job: runs.append(1))
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert runs == [1]


def test_payload_conflict_goes_to_review(world: Callable[..., World]) -> None:
    w = world(two_steps)
    w.deliver(FakeMessage(b"one", op="k"))
    assert w.deliver(FakeMessage(b"two", op="k")) == "ack"
    assert [r["pubsub_worker_reason"] for r in w.reviews()] == ["payload_conflict"]


def test_store_down_at_claim_defers(world: Callable[..., World]) -> None:
    w = world(two_steps)
    w.store.fail["create"] = StoreError("Firestore create failed after 9 tries")
    message = FakeMessage(op="k")
    assert w.deliver(message) == "defer"
    assert message.actions[0] == "deadline 10"


def test_busy_owner_defers_for_the_rest_of_its_lease(world: Callable[..., World]) -> None:
    release = threading.Event()

    def slow(message: Any, job: pubsub_worker.Job) -> None:
        if message.data == b"first":
            release.wait(10)

    w = world(slow)
    other = world(slow, store=w.store)  # another process: its own tracker and owner id
    first = FakeMessage(b"first", op="k")
    holder = threading.Thread(target=w.deliver, args=(first,))
    holder.start()
    try:
        while w.store.writes == 0:
            time.sleep(0.01)
        second = FakeMessage(b"first", op="k")
        other.wrapped.stop_jobs()  # do not poll: decide at once
        assert other.deliver(second) == "defer"
        assert second.actions[0].startswith("deadline ")
        assert 9 <= int(second.actions[0].split()[1]) <= 10
    finally:
        release.set()
        holder.join()
    assert first.outcome == "ack"


def test_an_error_retries_then_goes_to_review_at_the_last_attempt(
    world: Callable[..., World],
) -> None:
    def failing(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        raise ValueError("boom")

    w = world(failing, max_attempts=2)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["status"], w.record()["attempts"]) == ("released", 1)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.record()["status"] == "failed"
    assert w.record()["reason"] == Reason.ATTEMPTS
    assert len(w.reviews()) == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PermanentError("never"), "permanent"),
        (DocumentTooLarge("big"), "too_large"),
        (LimitExceeded("101 attributes"), "limits"),
    ],
)
def test_permanent_errors_go_to_review_at_once(
    world: Callable[..., World], error: Exception, reason: str
) -> None:
    def raising(message: Any, job: pubsub_worker.Job) -> None:
        raise error

    w = world(raising)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert (w.record()["status"], w.record()["reason"]) == ("failed", reason)
    assert [r["pubsub_worker_reason"] for r in w.reviews()] == [reason]


def test_shutdown_releases_without_counting_the_attempt(world: Callable[..., World]) -> None:
    w = world(two_steps)
    w.wrapped.stop_jobs()
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["status"], w.record()["attempts"]) == ("released", 0)


def test_a_handler_that_swallows_a_stop_signal_is_not_completed(
    world: Callable[..., World],
) -> None:
    def swallowing(message: Any, job: pubsub_worker.Job) -> None:
        try:
            job.step("a", lambda: 1)
        except ShuttingDown:
            pass  # wrong, but must not complete a job whose steps did not run

    w = world(swallowing)
    w.wrapped.stop_jobs()
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert w.record()["status"] == "released"


def test_lost_ownership_in_a_step_neither_writes_nor_acks(world: Callable[..., World]) -> None:
    def stolen(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        doc_id = job._core.identity.doc_id
        snap = w.store.get(doc_id)
        assert snap is not None  # another owner claims the job meanwhile
        w.store.update(doc_id, {(s.EPOCH,): 2, (s.OWNER,): "x"}, expected=snap.version)
        job.step("b", lambda: 2)

    w = world(stolen)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["epoch"], w.record()["status"]) == (2, "running")


def test_a_store_error_in_a_step_commit_is_a_failed_attempt(world: Callable[..., World]) -> None:
    def commits(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        w.store.fail["update"] = StoreError("Firestore update failed after 9 tries")
        job.step("b", lambda: 2)  # commits a's record first: fails

    w = world(commits)
    message = FakeMessage(op="k")
    assert w.deliver(message) == "defer"  # the release cannot be written either
    assert w.record()["status"] == "running"  # the Firestore lease lapses by itself


def test_a_failed_completion_write_defers(world: Callable[..., World]) -> None:
    def handler(message: Any, job: pubsub_worker.Job) -> None:
        w.store.fail["update"] = StoreError("down")

    w = world(handler)
    assert w.deliver(FakeMessage(op="k")) == "defer"


def test_an_unsent_outbox_entry_releases_with_backoff(world: Callable[..., World]) -> None:
    def publishing(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: job.publish("projects/p/topics/out", b"report"))

    w = world(publishing)
    w.publisher.fail["projects/p/topics/out"] = NotFound("no topic")  # type: ignore[no-untyped-call]
    message = FakeMessage(op="k")
    assert w.deliver(message) == "defer"
    assert message.actions[0] == "deadline 10"
    record = w.record()
    assert (record["status"], record["attempts"]) == ("released", 0)
    assert [e["sent"] for e in record["outbox"].values()] == [False]

    del w.publisher.fail["projects/p/topics/out"]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    record = w.record()
    assert record["status"] == "completed"
    assert [e["sent"] for e in record["outbox"].values()] == [True]
    assert [d for t, d, _ in w.publisher.sent if t.endswith("/out")] == [b"report"]


def test_publish_outside_a_step_is_a_step_of_its_own(world: Callable[..., World]) -> None:
    def publishing(message: Any, job: pubsub_worker.Job) -> None:
        job.publish("projects/p/topics/out", b"one")
        job.publish("projects/p/topics/out", b"two")

    w = world(publishing)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert sorted(w.record()["steps"]) == ["~publish.1", "~publish.2"]
    sent = [(d, a["effect_key"]) for t, d, a in w.publisher.sent if t.endswith("/out")]
    assert sent == [(b"one", "k:~publish.1:0"), (b"two", "k:~publish.2:0")]


def test_unsent_entries_go_out_before_the_attempts_check(world: Callable[..., World]) -> None:
    """A job that reaches MAX_ATTEMPTS with an entry unsent still publishes it, once."""

    def publishing(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: job.publish("projects/p/topics/out", b"report"))
        raise ValueError("after the publish")

    w = world(publishing, max_attempts=1)
    w.publisher.fail["projects/p/topics/out"] = NotFound("no topic")  # type: ignore[no-untyped-call]
    assert w.deliver(FakeMessage(op="k")) == "ack"  # attempt 1 of 1 failed: review
    assert w.record()["status"] == "failed"
    assert [e["sent"] for e in w.record()["outbox"].values()] == [False]
    # A replay resets the record; the next claim publishes before the attempts check.
    snap = w.store.get(document_id(SUB, "k"))
    assert snap is not None
    w.store.update(
        document_id(SUB, "k"),
        {(s.STATUS,): "released", (s.ATTEMPTS,): 5},
        expected=snap.version,
    )
    del w.publisher.fail["projects/p/topics/out"]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert [d for t, d, _ in w.publisher.sent if t.endswith("/out")] == [b"report"]


def test_the_cap_does_not_throw_back_a_job_whose_work_finished(
    world: Callable[..., World],
) -> None:
    def finishing(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        job._core.abandoned = True  # the cap passes while the completion is being written

    w = world(finishing)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.record()["status"] == "completed"


def test_the_cap_stops_a_job_at_its_next_step(world: Callable[..., World]) -> None:
    def slow(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        job._core.abandoned = True
        job.step("b", lambda: 2)

    w = world(slow)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["status"], w.record()["attempts"]) == ("released", 1)
    assert sorted(w.record()["steps"]) == ["a"]


def test_a_failure_path_that_fails_defers_and_loses_nothing(world: Callable[..., World]) -> None:
    def raising(message: Any, job: pubsub_worker.Job) -> None:
        raise PermanentError("never")

    w = world(raising)
    w.publisher.fail[FAILURES] = NotFound("topic deleted")  # type: ignore[no-untyped-call]
    message = FakeMessage(op="k")
    assert w.deliver(message) == "defer"
    # Recorded failed (it never runs again), its failure message pending: it comes back.
    assert (w.record()["status"], w.record()["review"]) == ("failed", "pending")
    assert w.wrapped.metrics.get(pubsub_worker.Counter.FAILURE_PATH_ERRORS) == 1
    del w.publisher.fail[FAILURES]
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert (w.record()["status"], w.record()["review"]) == ("failed", "sent")
    assert len(w.reviews()) == 1


def test_an_unchanged_callbacks_ack_completes_the_job_and_its_nack_releases_it(
    world: Callable[..., World],
) -> None:
    def unchanged(message: Any) -> None:
        message.job.step("a", lambda: 1)
        if message.data == b"nack":
            message.nack()
        else:
            message.ack()

    w = world(unchanged)
    assert w.deliver(FakeMessage(b"ack", op="k")) == "ack"
    assert w.record()["status"] == "completed"
    assert w.deliver(FakeMessage(b"nack", op="n")) == "nack"
    assert (w.record("n")["status"], w.record("n")["attempts"]) == ("released", 1)


def test_an_unchanged_callback_that_acks_during_shutdown_is_released(
    world: Callable[..., World],
) -> None:
    """An unchanged callback that catches the stop and acks anyway is released, like a job."""

    def unchanged(message: Any) -> None:
        try:
            message.job.step("a", lambda: 1)
        except ShuttingDown:
            pass
        message.ack()

    w = world(unchanged)
    w.wrapped.stop_jobs()
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["status"], w.record()["attempts"]) == ("released", 0)


def test_a_conflict_that_cannot_be_settled_defers(world: Callable[..., World]) -> None:
    def handler(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        w.store.fail["update"] = VersionConflict("moved")
        w.store.fail["get"] = StoreError("and the read fails too")

    w = world(handler)
    assert w.deliver(FakeMessage(op="k")) == "defer"


def test_what_is_not_callable_is_refused_at_wrap_time() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        pubsub_worker.exactly_once("handler")  # type: ignore[call-overload]


def test_a_handler_returning_a_coroutine_is_never_completed(world: Callable[..., World]) -> None:
    async def work() -> None:
        pass

    w = world(lambda message, job: work(), max_attempts=1)
    assert w.deliver(FakeMessage(op="k")) == "ack"  # to review, not completed
    assert w.record()["status"] == "failed"
    assert "awaitable" in w.record()["error"]


# -- ordering keys --------------------------------------------------------------------


def _ordered(op: str, data: bytes = b"payload") -> FakeMessage:
    message = FakeMessage(data, op=op)
    message.ordering_key = "customer-1"  # type: ignore[attr-defined]
    return message


def test_a_deferred_message_is_not_overtaken_by_the_next_of_its_ordering_key() -> None:
    ran: list[str] = []
    w = World(lambda message, job: ran.append(job.key))
    first, second = _ordered("k1"), _ordered("k2")  # published in this order
    w.store.fail["create"] = StoreError("briefly down")
    assert w.deliver(first) == "defer"
    del w.store.fail["create"]
    assert w.deliver(second) == "defer"  # held back behind the first: not claimed, not run
    assert second.actions[0] == first.actions[0]  # back no earlier than the first
    assert ran == []
    assert w.deliver(_again(first)) == "ack"
    assert w.deliver(_again(second)) == "ack"
    assert ran == ["k1", "k2"]


def test_a_retried_message_holds_its_key_until_it_is_done() -> None:
    ran: list[str] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        ran.append(job.key)
        if message.data == b"flaky" and job.attempt == 1:
            raise ValueError("transient")

    w = World(handler)
    first, second = _ordered("k1", b"flaky"), _ordered("k2")
    assert w.deliver(first) == "nack"  # a failed attempt: released, nacked
    assert w.deliver(second) == "defer"  # waits for the first
    assert w.deliver(_again(first)) == "ack"
    assert w.deliver(_again(second)) == "ack"
    assert ran == ["k1", "k1", "k2"]


def test_a_message_sent_to_review_does_not_hold_its_key() -> None:
    """Like a dead-letter topic: the rest of the key goes on; replay runs it after them."""
    ran: list[str] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        ran.append(job.key)
        if message.data == b"poison":
            raise PermanentError("never")

    w = World(handler)
    assert w.deliver(_ordered("k1", b"poison")) == "ack"
    assert w.deliver(_ordered("k2")) == "ack"
    assert ran == ["k1", "k2"]
    assert len(w.reviews()) == 1


def _again(message: FakeMessage) -> FakeMessage:
    """A redelivery of ``message``: same id and publish time, a new ack id."""
    again = FakeMessage(message.data, **message.attributes)
    again.message_id, again.publish_time = message.message_id, message.publish_time
    again.ack_id = message.ack_id + "-again"
    again.ordering_key = "customer-1"  # type: ignore[attr-defined]
    return again
