"""An existing ``callback(message)``: the stock client's contract, on the in-memory store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker.stores import base as s
from tests.support.world import SUB, FakeMessage, World


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(4, thread_name_prefix="users-own")
    yield executor
    executor.shutdown(wait=True)


def _bump_epoch(world: World, key: str = "k") -> None:
    """Another owner takes the job over (what a claim elsewhere or `jobs release` does)."""
    doc_id = document_id(SUB, key)
    snap = world.store.get(doc_id)
    assert snap is not None
    world.store.update(
        doc_id,
        {("epoch",): snap.fields["epoch"] + 1, ("owner",): "elsewhere"},
        expected=snap.version,
    )


def test_an_ack_from_the_users_own_thread_after_the_callback_returned_completes_once(
    pool: ThreadPoolExecutor,
) -> None:
    runs: list[str] = []
    go = threading.Event()

    def work(message: Any) -> None:
        assert go.wait(10)
        runs.append(message.job.step("work", lambda: "done"))
        message.ack()

    w = World(lambda message: pool.submit(work, message))
    message = FakeMessage(op="k")
    w.wrapped(message)  # the callback returned; the work has not started
    assert message.actions == []  # neither acked nor nacked: held, not a failed attempt
    assert w.record()["status"] == "running"
    go.set()
    assert w.wrapped.wait_concluded(10)  # drain-style wait also covers held messages
    assert message.outcome == "ack"
    assert w.record()["status"] == "completed"
    assert w.record()["attempts"] == 1
    assert runs == ["done"]
    w.close()


def test_a_held_message_keeps_its_key_until_it_is_acked(pool: ThreadPoolExecutor) -> None:
    go = threading.Event()
    held: list[Any] = []

    def callback(message: Any) -> None:
        held.append(message)

    w = World(callback)
    first = FakeMessage(op="k")
    w.wrapped(first)
    second = FakeMessage(op="k")  # another message of the same job, while the first is held
    waiting = threading.Thread(target=w.wrapped, args=(second,), daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # it waits for the key
    pool.submit(lambda: (go.wait(10), held[0].ack()))
    go.set()
    waiting.join(10)
    assert w.wrapped.wait_concluded(10)
    assert first.outcome == "ack"
    assert second.outcome == "ack"  # found the job completed
    assert len(held) == 1  # the callback ran once
    w.close()


def test_a_nack_from_another_thread_releases_the_job_with_the_attempt_counted(
    pool: ThreadPoolExecutor,
) -> None:
    w = World(lambda message: pool.submit(message.nack))
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert w.wrapped.wait_concluded(10)
    assert message.outcome == "nack"
    assert w.record()["status"] == "released"
    assert w.record()["attempts"] == 1


def test_ack_with_response_is_success_once_the_completion_is_durable() -> None:
    answers: list[Any] = []
    statuses: list[str] = []

    def callback(message: Any) -> None:
        answers.append(message.ack_with_response().result(timeout=5))
        statuses.append(w.record()["status"])

    w = World(callback)
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert answers == [AcknowledgeStatus.SUCCESS]
    assert statuses == ["completed"]
    assert message.outcome == "ack"


def test_ack_with_response_of_a_fenced_delivery_raises_invalid_ack_id() -> None:
    errors: list[AcknowledgeError] = []

    def callback(message: Any) -> None:
        _bump_epoch(w)
        try:
            message.ack_with_response().result(timeout=5)
        except AcknowledgeError as exc:
            errors.append(exc)

    w = World(callback)
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert [e.error_code for e in errors] == [AcknowledgeStatus.INVALID_ACK_ID]
    assert w.record()["status"] == "running"  # this delivery recorded nothing
    assert w.record()["owner"] == "elsewhere"
    assert "ack" not in message.actions


def test_ack_with_response_when_the_completion_cannot_be_written_is_an_error() -> None:
    errors: list[AcknowledgeError] = []

    def callback(message: Any) -> None:
        w.store.fail["update"] = RuntimeError("store down")
        try:
            message.ack_with_response().result(timeout=5)
        except AcknowledgeError as exc:
            errors.append(exc)

    w = World(callback)
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert [e.error_code for e in errors] == [AcknowledgeStatus.OTHER]
    assert message.outcome == "defer"  # it comes back and finds what was done


def test_ack_with_response_passes_on_pubsubs_refusal() -> None:
    errors: list[AcknowledgeError] = []

    class Refused(FakeMessage):
        def ack_with_response(self) -> Any:
            future = super().ack_with_response()
            refused = type(future)()
            refused.set_exception(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, "stale"))
            return refused

    def callback(message: Any) -> None:
        try:
            message.ack_with_response().result(timeout=5)
        except AcknowledgeError as exc:
            errors.append(exc)

    w = World(callback)
    w.wrapped(Refused(op="k"))
    assert [e.error_code for e in errors] == [AcknowledgeStatus.INVALID_ACK_ID]
    assert w.record()["status"] == "completed"  # durable anyway: the redelivery acks


def test_nack_with_response_is_success_once_the_release_is_durable() -> None:
    answers: list[Any] = []

    def callback(message: Any) -> None:
        answers.append(message.nack_with_response().result(timeout=5))

    w = World(callback)
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert answers == [AcknowledgeStatus.SUCCESS]
    assert w.record()["status"] == "released"
    assert message.outcome == "nack"


def test_the_first_of_ack_and_nack_decides_and_job_calls_after_it_are_refused() -> None:
    refused: list[str] = []

    def callback(message: Any) -> None:
        message.ack()
        message.nack()  # ignored: the ack decided
        try:
            message.job.step("late", lambda: 1)
        except RuntimeError as exc:
            refused.append(str(exc))

    w = World(callback)
    message = FakeMessage(op="k")
    w.wrapped(message)
    assert message.outcome == "ack"
    assert w.record()["status"] == "completed"
    assert len(refused) == 1
    assert "late" not in w.record().get("steps", {})


def test_a_stray_job_call_after_the_handler_returned_does_not_release_a_finished_job() -> None:
    """A helper thread winding down (a heartbeat during shutdown) cannot undo the return."""
    jobs: list[pubsub_worker.Job] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        jobs.append(job)

    w = World(handler)
    hold = threading.Event()
    store_update = w.store.update

    def slow_update(doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        if changes.get(("status",)) == "completed":
            assert hold.wait(10)  # the completion waits; meanwhile the stray call comes
        return store_update(doc_id, changes, expected=expected)

    w.store.update = slow_update  # type: ignore[method-assign]
    message = FakeMessage(op="k")
    w.wrapped(message)
    w.wrapped.stop_jobs()  # a shutdown begins while the completion is under way
    with pytest.raises(RuntimeError, match="already returned"):
        jobs[0].heartbeat()
    hold.set()
    assert w.wrapped.wait_concluded(10)
    assert message.outcome == "ack"
    assert w.record()["status"] == "completed"


def test_a_message_held_after_its_cap_passed_is_expired_at_once() -> None:
    """The callback ran past the processing cap, then handed the message to its own pool
    (returned without ack or nack): the keeper had abandoned the job before the hold. It is
    concluded at once as a failed attempt; its key is free again and drain() returns."""

    def callback(message: Any) -> None:  # returns without ack() or nack(): held
        keeper.tick(now=time.monotonic() + 10_000)  # the cap passes while the callback runs

    w = World(callback, lease_seconds=10)
    keeper = w.wrapped.engine.runtime().keeper
    try:
        message = FakeMessage(op="k")
        w.wrapped(message)
        assert w.wrapped.drain(10)  # nothing held any more
        assert message.actions[-1] == "nack"  # dropped when abandoned, nacked once expired
        record = w.record()
        assert (record["status"], record["attempts"]) == ("released", 1)
        again = FakeMessage(op="k")  # the key is free in this process
        w.wrapped.start(check_subscription=False)
        w.wrapped(again)
        assert w.wrapped.wait_concluded(10)
        assert again.actions[-1] == "nack"  # held again, and expired again: its cap passed too
    finally:
        w.close()
