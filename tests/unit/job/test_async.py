"""``async def`` handlers on the in-memory store: the same outcomes, awaited."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pubsub_worker._job.async_job import AsyncJob
from pubsub_worker._job.keys import document_id
from pubsub_worker.stores import base as s
from tests.support.world import FakeMessage, FlakyStore, World, world

__all__ = ["world"]  # the fixture, shared with the sync matrix


def test_an_async_job_awaits_async_and_sync_steps_then_completes(
    world: Callable[..., World],
) -> None:
    ran: list[str] = []

    async def fetch() -> str:
        await asyncio.sleep(0)
        ran.append("fetch")
        return "body"

    def store_it() -> int:  # a sync step function: runs off the loop
        ran.append(threading.current_thread().name)
        return 7

    async def handle(message: Any, job: AsyncJob) -> None:
        body = await job.step("fetch", fetch)
        assert body == "body"
        assert await job.step("store", store_it) == 7

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert ran[0] == "fetch"
    assert ran[1].startswith("pubsub-worker-io")
    record = w.record()
    assert record["status"] == "completed"
    assert sorted(record["steps"]) == ["fetch", "store"]
    assert w.deliver(FakeMessage(op="k")) == "ack"  # a redelivery runs nothing
    assert ran[2:] == []


def test_an_async_unchanged_callback_acks_and_nacks(world: Callable[..., World]) -> None:
    async def callback(message: Any) -> None:
        await message.job.step("a", lambda: 1)
        if message.data == b"nack":
            message.nack()
        else:
            message.ack()

    w = world(callback)
    assert w.deliver(FakeMessage(b"ack", op="k")) == "ack"
    assert w.record()["status"] == "completed"
    assert w.deliver(FakeMessage(b"nack", op="n")) == "nack"
    assert (w.record("n")["status"], w.record("n")["attempts"]) == ("released", 1)


def test_shutdown_reaches_the_next_await(world: Callable[..., World]) -> None:
    async def handle(message: Any, job: AsyncJob) -> None:
        await job.step("a", lambda: 1)
        w.wrapped.stop_jobs()
        await job.step("b", lambda: 2)

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    record = w.record()
    assert (record["status"], record["attempts"], sorted(record["steps"])) == (
        "released",
        0,
        ["a"],
    )


def test_lost_ownership_reaches_the_next_await(world: Callable[..., World]) -> None:
    async def handle(message: Any, job: AsyncJob) -> None:
        await job.step("a", lambda: 1)
        doc_id = document_id(w.wrapped.settings.subscription_path, job.key)
        snap = w.store.get(doc_id)
        assert snap is not None
        w.store.update(doc_id, {(s.EPOCH,): 9}, expected=snap.version)
        await job.step("b", lambda: 2)

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert (w.record()["epoch"], w.record()["status"]) == (9, "running")


def test_an_async_transactional_step_commits_on_the_in_memory_store_and_runs_once(
    world: Callable[..., World],
) -> None:
    """A unit test of an ``async def`` handler's transactional step needs no Firestore."""
    bodies: list[str] = []

    async def handle(message: Any, job: AsyncJob) -> None:
        async def record(transaction: Any) -> int:
            await asyncio.sleep(0)
            bodies.append(job.key)
            transaction.set(f"effect-{job.key}", {"by": job.epoch})
            return 5

        assert await job.transactional_step("record", record) == 5
        assert await job.step("after", lambda: 1) == 1

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    record = w.record()
    assert (record["status"], sorted(record["steps"])) == ("completed", ["after", "record"])
    assert record["steps"]["record"]["result"] == "5"
    effect = w.store.get("effect-k")
    assert effect is not None
    assert effect.fields == {"by": 1}
    assert w.deliver(FakeMessage(op="k")) == "ack"  # a redelivery: acked from the record
    assert bodies == ["k"]


def test_a_stale_owner_s_async_transaction_never_lands(world: Callable[..., World]) -> None:
    async def handle(message: Any, job: AsyncJob) -> None:
        doc_id = document_id(w.wrapped.settings.subscription_path, job.key)
        snap = w.store.get(doc_id)
        assert snap is not None
        w.store.update(doc_id, {(s.EPOCH,): 9}, expected=snap.version)  # a new owner's claim

        async def record(transaction: Any) -> int:
            transaction.set("effect-stale", {"by": "stale owner"})
            return 5

        await job.transactional_step("record", record)

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "nack"  # lost: nacked for the owner's delivery
    assert (w.record()["epoch"], w.record()["status"]) == (9, "running")
    assert w.store.get("effect-stale") is None


class _NoTransactions(FlakyStore):
    """A store of one's own without transactions: neither ``transact`` nor
    ``transact_async`` (what the store protocols check for)."""

    transact = None  # type: ignore[assignment]
    transact_async = None  # type: ignore[assignment]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_transactional_step_on_a_store_without_transactions_goes_to_review_at_once(
    world: Callable[..., World], kind: str
) -> None:
    """No attempt would do better: reviewed on the first, with the store named, not retried."""

    def sync_handle(message: Any, job: Any) -> None:
        job.transactional_step("record", lambda transaction: 1)

    async def async_handle(message: Any, job: AsyncJob) -> None:
        async def record(transaction: Any) -> int:
            return 1

        await job.transactional_step("record", record)

    w = world(sync_handle if kind == "sync" else async_handle, store=_NoTransactions())
    assert w.deliver(FakeMessage(op="k")) == "ack"  # the review is the job's outcome
    record = w.record()
    assert (record["status"], record["reason"], record["attempts"]) == ("failed", "permanent", 1)
    assert "_NoTransactions" in record["error"]
    assert ("transact_async()" if kind == "async" else "transact()") in record["error"]
    (review,) = w.reviews()
    assert review["pubsub_worker_reason"] == "permanent"


def test_a_cancelled_step_records_nothing(world: Callable[..., World]) -> None:
    async def cancelled() -> int:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)
        return 1

    async def handle(message: Any, job: AsyncJob) -> None:
        await job.step("a", lambda: 1)
        await job.step("b", cancelled)

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "nack"  # a failed attempt, retried
    record = w.record()
    assert (record["status"], sorted(record["steps"])) == ("released", ["a"])


def test_async_publish_outside_a_step_is_a_step_of_its_own(world: Callable[..., World]) -> None:
    async def handle(message: Any, job: AsyncJob) -> None:
        job.publish("projects/p/topics/out", b"one")  # not awaited: committed before completion

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert sorted(w.record()["steps"]) == ["~publish.1"]
    assert [d for t, d, _ in w.publisher.sent if t.endswith("/out")] == [b"one"]


def test_many_async_publishes_outside_a_step_go_out_in_call_order_without_recursion(
    world: Callable[..., World],
) -> None:
    """Each is a step of its own, committed and published one after the other as called: more
    than the interpreter's recursion limit of them, flushed at the next ``await job.*``."""
    count = 1500

    async def handle(message: Any, job: AsyncJob) -> None:
        for n in range(count):
            job.publish("projects/p/topics/out", str(n).encode())
        await job.step("after", lambda: 1)

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    sent = [d for t, d, _ in w.publisher.sent if t.endswith("/out")]
    assert sent == [str(n).encode() for n in range(count)]
    steps = w.record()["steps"]
    assert len(steps) == count + 1
    assert {f"~publish.{n}" for n in range(1, count + 1)} <= set(steps)


def test_many_async_jobs_run_at_once_on_one_loop(world: Callable[..., World]) -> None:
    running = 0
    most = 0
    gate = asyncio.Event()

    async def handle(message: Any, job: AsyncJob) -> None:
        async def wait() -> str:
            nonlocal running, most
            running += 1
            most = max(most, running)
            if most == 20:
                gate.set()
            await asyncio.wait_for(gate.wait(), 10)
            running -= 1
            return "done"

        await job.step("wait", wait)

    w = world(handle, max_messages=20)
    messages = [FakeMessage(op=f"k{n}") for n in range(20)]
    threads = [threading.Thread(target=w.deliver, args=(m,)) for m in messages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most == 20  # every job was inside its step at the same time, on one loop
    assert [m.outcome for m in messages] == ["ack"] * 20


def test_only_the_writes_of_async_steps_leave_the_loop(
    world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checks and staging run on the loop; each write runs in the I/O pool, never on the loop."""
    handed: list[str] = []
    writers: list[str] = []

    async def value() -> int:
        return 1

    async def handle(message: Any, job: AsyncJob) -> None:
        await job.step("a", value)  # staged: written when b opens
        await job.step("b", lambda: job.publish("projects/p/topics/out", b"x"))  # written now
        await job.step("c", value)  # nothing of b's record left to write first
        await job.heartbeat()  # the lease is not due

    w = world(handle)
    io = w.wrapped.engine.call.loop.io
    submit = io.submit

    def counted(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        handed.append(getattr(fn, "func", fn).__name__)
        return submit(fn, *args, **kwargs)

    def update(doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        writers.append(threading.current_thread().name)
        return FlakyStore.update(w.store, doc_id, changes, expected=expected)

    monkeypatch.setattr(io, "submit", counted)
    monkeypatch.setattr(w.store, "update", update)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert sorted(w.record()["steps"]) == ["a", "b", "c"]
    # b's function is sync (it runs in the pool); the two writes: a's record, b's outbox.
    assert handed == ["open_step", "<lambda>", "write_step"]
    assert not any(name.startswith("pubsub-worker-loop") for name in writers)
    assert [d for t, d, _ in w.publisher.sent if t.endswith("/out")] == [b"x"]


def test_an_async_step_does_not_wait_on_the_loop_for_a_write_under_way(
    world: Callable[..., World],
) -> None:
    """A renewal holding the document: the step's record goes to the pool; the loop runs on."""
    held, release, gave_up = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def renewal(job: AsyncJob) -> None:  # the lease keeper's write, as long as it takes
        with job._core.document.unless_busy() as free:
            assert free
            held.set()
            if not release.wait(5):
                gave_up.set()

    async def handle(message: Any, job: AsyncJob) -> None:
        async def work() -> int:
            threading.Thread(target=renewal, args=(job,)).start()
            await asyncio.to_thread(held.wait, 5)
            return 1

        step = asyncio.create_task(job.step("a", work))
        await asyncio.to_thread(held.wait, 5)
        await asyncio.sleep(0.2)  # reached only while the loop runs
        seen["step waits"] = not step.done()
        release.set()
        seen["recorded"] = await step == 1

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert not gave_up.is_set()  # the loop never waited for the renewal to end
    assert seen == {"step waits": True, "recorded": True}
    assert sorted(w.record()["steps"]) == ["a"]
