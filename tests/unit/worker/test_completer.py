"""A returned handler concludes off its callback thread: the thread is free, the outcome alike."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker._worker.completer import Completer
from pubsub_worker.stores import base as s
from tests.support.world import SUB, FakeMessage, FlakyStore, World

__all__ = ["held"]


class HeldStore(FlakyStore):
    """Holds every completion's write (an update to ``completed``) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.completing = threading.Event()

    def update(self, doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        if changes.get(("status",)) == "completed":
            self.completing.set()
            assert self.release.wait(10)
        return super().update(doc_id, changes, expected=expected)


def one_step(message: Any, job: pubsub_worker.Job) -> None:
    job.step("a", lambda: 1)


@pytest.fixture
def held_world() -> Iterator[Callable[[Any], World]]:
    """``held_world(handler)``: a world whose completions wait until the test releases them."""
    worlds: list[World] = []

    def make(handler: Any) -> World:
        worlds.append(World(handler, store=HeldStore()))
        return worlds[-1]

    yield make
    for w in worlds:
        assert isinstance(w.store, HeldStore)
        w.store.release.set()
        w.close()


@pytest.fixture
def held(held_world: Callable[[Any], World]) -> World:
    return held_world(one_step)


def _in_thread(call: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_the_callback_returns_before_the_completion_is_durable_and_acks_after(
    held: World,
) -> None:
    store = held.store
    assert isinstance(store, HeldStore)
    message = FakeMessage(op="k")
    callback = _in_thread(lambda: held.wrapped(message))
    assert store.completing.wait(10)
    callback.join(5)
    assert not callback.is_alive()  # the thread is free while the completion's write waits
    assert message.actions == []  # and nothing is acked before the record is durable
    assert held.record()["status"] == "running"
    store.release.set()
    assert held.wrapped.wait_concluded(10)
    assert message.outcome == "ack"
    assert held.record()["status"] == "completed"


def test_a_redelivery_waits_for_the_pending_completion_and_does_not_run_again(
    held_world: Callable[[Any], World],
) -> None:
    runs: list[str] = []
    held = held_world(lambda message, job: runs.append(job.step("a", lambda: "ran")))
    store = held.store
    assert isinstance(store, HeldStore)
    original = FakeMessage(op="k")
    _in_thread(lambda: held.wrapped(original)).join(10)
    assert store.completing.wait(10)
    again = FakeMessage(op="k")  # another message with the same key, while the first completes
    second = _in_thread(lambda: held.wrapped(again))
    time.sleep(0.3)
    assert second.is_alive()  # it waits for the key, held until the first is concluded
    store.release.set()
    second.join(10)
    assert held.wrapped.wait_concluded(10)
    assert original.outcome == "ack"
    assert again.outcome == "ack"
    assert runs == ["ran"]  # the job ran once; the second delivery found it completed


def test_after_drain_a_running_job_concludes_on_its_callback_thread(
    held_world: Callable[[Any], World],
) -> None:
    started, go = threading.Event(), threading.Event()

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        started.set()
        assert go.wait(10)

    held = held_world(handler)
    store = held.store
    assert isinstance(store, HeldStore)
    store.release.set()
    message = FakeMessage(op="k")
    callback = _in_thread(lambda: held.wrapped(message))
    assert started.wait(10)
    assert held.wrapped.drain(5)  # the running job holds no conclusion yet
    go.set()
    callback.join(10)
    assert message.outcome == "ack"  # concluded before the callback returned: no wait
    assert held.wrapped.wait_concluded(0)
    assert held.record()["status"] == "completed"


def test_after_drain_a_new_delivery_is_nacked_without_a_claim(held: World) -> None:
    store = held.store
    assert isinstance(store, HeldStore)
    store.release.set()
    assert held.wrapped.drain(5)
    message = FakeMessage(op="fresh")
    held.wrapped(message)
    assert message.outcome == "nack"  # the next worker takes it
    assert held.store.get(document_id(SUB, "fresh")) is None  # nothing was claimed or written
    held.wrapped.start(check_subscription=False)  # started again (a supervisor loop)
    again = FakeMessage(op="fresh")
    held.wrapped(again)
    assert held.wrapped.wait_concluded(10)
    assert again.outcome == "ack"


def test_drain_waits_for_the_conclusions_under_way(held: World) -> None:
    store = held.store
    assert isinstance(store, HeldStore)
    message = FakeMessage(op="k")
    _in_thread(lambda: held.wrapped(message)).join(10)
    assert store.completing.wait(10)
    assert not held.wrapped.drain(0.2)  # the completion's write is still held
    threading.Timer(0.2, store.release.set).start()
    assert held.wrapped.drain(10)
    assert message.outcome == "ack"


def test_a_closed_completer_takes_nothing_and_says_so() -> None:
    completer = Completer(2)
    ran: list[int] = []
    assert completer.submit(lambda: ran.append(1))
    assert completer.close(5)
    assert not completer.submit(lambda: ran.append(2))
    assert ran == [1]
    assert completer.pending == 0


def test_a_conclusion_runs_in_the_submitters_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the delivery's")
    seen: list[str] = []
    completer = Completer(1)
    assert completer.submit(lambda: seen.append(var.get()))
    assert completer.close(5)
    assert seen == ["the delivery's"]


def test_a_completion_with_unsent_entries_never_holds_up_the_completers_other_jobs() -> None:
    """A publish brownout: the completion of job A must republish its entry, slowly.

    It is concluded on A's own callback thread; job B, concluded on the
    (one-thread) completer meanwhile, is acked at once instead of queueing
    behind A's publish until its lease runs out.
    """
    output = "projects/p/topics/output"
    resume = threading.Event()
    calls: list[str] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        if job.key == "a":
            job.step("produce", lambda: job.publish(output, b"out"))
        else:
            job.step("plain", lambda: 1)

    w = World(handler, max_messages=1)  # a completer of one thread
    plain_publish = w.publisher.publish

    def brownout(topic: str, data: bytes, **attributes: str) -> Future[str]:
        if topic != output:
            return plain_publish(topic, data, **attributes)
        calls.append(topic)
        future: Future[str] = Future()
        if len(calls) == 1:
            future.set_exception(RuntimeError("publish timed out"))  # left unsent by its step
        else:

            def answer_late() -> None:
                resume.wait(10)
                future.set_result("1")

            threading.Thread(target=answer_late, daemon=True).start()
        return future

    w.publisher.publish = brownout  # type: ignore[method-assign]
    first = FakeMessage(op="a")
    a = _in_thread(lambda: w.wrapped(first))
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 2  # A's completion is republishing, slowly
    second = FakeMessage(op="b")
    w.wrapped(second)
    deadline = time.monotonic() + 5
    while not second.actions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert second.actions == ["ack"]  # B did not wait behind A's publish
    assert first.actions == []
    assert a.is_alive()  # A's own callback thread carries A's slow completion
    resume.set()
    a.join(10)
    assert w.wrapped.wait_concluded(10)
    assert first.outcome == "ack"
    assert w.record("a")["status"] == "completed"
    w.close()


def test_a_completer_opened_for_the_flow_control_runs_that_many_conclusions_at_once() -> None:
    completer = Completer(2, taking=False)
    completer.reopen(5)  # run(): as many as its flow control admits
    assert completer.threads == 5
    together = threading.Barrier(5)
    met: list[int] = []

    def conclusion() -> None:
        together.wait(10)  # breaks (an error) unless five run at once
        met.append(1)

    for _ in range(5):
        assert completer.submit(conclusion)
    assert completer.wait(15)
    assert len(met) == 5
    completer.reopen(50)  # already open: unchanged
    assert completer.threads == 5
    assert completer.close(5)


def test_start_sizes_the_completer_from_the_caller() -> None:
    w = World(one_step)  # opened by start(conclude_off_thread=True): MAX_MESSAGES threads
    try:
        assert w.wrapped.engine.runtime().completer.threads == w.wrapped.settings.max_messages
        assert w.wrapped.drain(5)
        w.wrapped.start(check_subscription=False, conclude_off_thread=True, concluding_threads=30)
        assert w.wrapped.engine.runtime().completer.threads == 30
        assert w.deliver(FakeMessage(op="k")) == "ack"
    finally:
        w.close()
