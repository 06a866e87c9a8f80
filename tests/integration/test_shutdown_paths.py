"""Ending a wrapped subscriber the ways real code does: nothing lost, nothing done twice.

The stock client's shutdown options keep their meaning when the callback is
wrapped (``await_callbacks_on_shutdown``, ``cancel()`` or ``close()`` without
``drain()``), and :func:`pubsub_worker.run` can stop and run again with the
same handler, takes nothing new while it drains, and gives back the attempt
of an ``async def`` handler it cancelled. In-process workers against the
real emulators; counts are exact. Helpers are those of
``test_adoption_paths.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker.stores.batching import BatchingFirestoreJobStore
from tests.support.observe import assert_not_redelivered, end_stale_streams

from .conftest import RunningWorker
from .test_adoption_paths import (
    WAIT_S,
    HoldingRecorder,
    Recorder,
    Tally,
    consuming,
    doc_state,
    lease_flow,
    publish_keys,
    states,
    wait_until,
)

pytestmark = pytest.mark.emulator

LONG_S = 60.0
"""A job that runs longer than any shutdown grace of these tests."""


def _heartbeat_for(job: pubsub_worker.Job, seconds: float) -> None:
    """A long step body that reports progress; the shutdown stops it at a heartbeat."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        job.heartbeat()


async def _aheartbeat_for(job: pubsub_worker.AsyncJob, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        await job.heartbeat()


# -- 4. await_callbacks_on_shutdown, and ending the stream without drain() --------------


@pytest.mark.parametrize("shape", ["callback", "job"])
def test_await_callbacks_on_shutdown_waits_for_running_handlers_whose_jobs_complete_once(
    shape: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``await_callbacks_on_shutdown=True``, then ``future.cancel(); future.result()``.

    Three handlers are running when the future is cancelled (no ``drain()``).
    ``result()`` returns once they have: their work is done by then, each job
    is completed once, and no message comes back.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, started, work = Recorder(), Tally(), Tally()
    go = threading.Event()

    def callback(message: Any) -> None:
        started.add("all")
        go.wait(WAIT_S)
        work.add(message.attributes["op"])
        message.ack()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        started.add("all")
        go.wait(WAIT_S)
        job.step("work", lambda: work.add(job.key))

    handler: Any = callback if shape == "callback" else handle
    wrapped = pubsub_worker.exactly_once(handler, settings=settings, hooks=hooks)
    keys = ["job-0", "job-1", "job-2"]
    client = pubsub_v1.SubscriberClient()
    future = client.subscribe(
        eod_subscription.subscription_path,
        callback=wrapped,
        flow_control=lease_flow(settings),
        await_callbacks_on_shutdown=True,
    )
    try:
        publish_keys(publisher, eod_subscription.topic_path, keys)
        assert wait_until(lambda: started.count("all") == len(keys))
        future.cancel()
        threading.Timer(1.0, go.set).start()  # the handlers still run while the stream closes
        future.result(timeout=WAIT_S)
        done_when_result_returned = work.as_dict()
    finally:
        go.set()
        client.close()
    wrapped.wait_concluded(WAIT_S)
    wrapped.close()

    assert done_when_result_returned == dict.fromkeys(keys, 1)
    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


HELD_KEYS = ("job-0", "job-1")


@pytest.mark.parametrize("ending", ["cancel", "close"])
@pytest.mark.parametrize("shape", ["job", "callback"])
def test_ending_the_stream_without_drain_loses_nothing_and_acks_nothing_twice(
    shape: str,
    ending: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``future.cancel()`` or ``subscriber.close()`` without ``drain()``, conclusions under way.

    Six jobs; the completions of two are durable and their acks held (a
    hook) when the stream is ended. A second subscriber started after the
    first one closed finds whatever came back done: each job's work ran
    once overall, each message got exactly one ``SUCCESS`` ack across both
    subscribers (none lost, none acked twice), and none comes back after.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    work = Tally()
    first_hooks, second_hooks = HoldingRecorder(lambda key: key in HELD_KEYS), Recorder()

    def callback(message: Any) -> None:
        work.add(message.attributes["op"])
        message.ack()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("work", lambda: work.add(job.key))

    handler: Any = callback if shape == "callback" else handle
    # One write per batch: a finished job's ack is sent by the thread that settled its
    # completion's write, and the hook held there would hold the other writes of its batch.
    store = BatchingFirestoreJobStore(firestore_client, settings.collection, max_batch=1)
    first = pubsub_worker.exactly_once(handler, settings=settings, hooks=first_hooks, store=store)
    keys = [f"job-{n}" for n in range(6)]
    client = pubsub_v1.SubscriberClient()
    future = client.subscribe(
        eod_subscription.subscription_path, callback=first, flow_control=lease_flow(settings)
    )
    try:
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        others = [i for k, i in zip(keys, ids, strict=True) if k not in HELD_KEYS]
        assert wait_until(
            lambda: first_hooks.held == len(HELD_KEYS) and first_hooks.answered(others)
        ), first_hooks.snapshot()
        if ending == "cancel":
            future.cancel()
            future.result(timeout=WAIT_S)
        else:
            client.close()
            if not wait_until(future.done, 30):
                future.cancel()
    finally:
        first_hooks.go.set()
        client.close()
    first.wait_concluded(WAIT_S)
    wait_until(lambda: first.in_flight() == 0)
    first.close()
    store.close()

    end_stale_streams(subscriber, eod_subscription.subscription_path)
    second = pubsub_worker.exactly_once(handler, settings=settings, hooks=second_hooks)

    def successes(message_id: str) -> int:
        answers = first_hooks.answers.get(message_id, []) + second_hooks.answers.get(message_id, [])
        return answers.count("SUCCESS")

    with consuming(second, settings, "subscribe"):
        wait_until(lambda: all(successes(i) >= 1 for i in ids))

    assert work.as_dict() == dict.fromkeys(keys, 1), (
        first_hooks.snapshot(),
        second_hooks.snapshot(),
    )
    assert {i: successes(i) for i in ids} == dict.fromkeys(ids, 1), (
        first_hooks.snapshot(),
        second_hooks.snapshot(),
    )
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


# -- 5. run() twice with one handler ---------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_run_twice_with_one_handler_completes_new_messages_after_a_shutdown(
    flavour: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """A supervisor loop: ``run(handle, stop=ev)``, stopped mid-job, then ``run(handle)`` again.

    The first run's shutdown (grace 1 s) is shorter than its running job,
    which is released with its attempt given back. The second run, with the
    same ``ExactlyOnce`` object, completes three new messages (each once, at
    their first attempt, not nacked in a loop) and the released job.
    """
    settings = settings_for(eod_subscription, key_attribute="op", shutdown_grace_seconds=1)
    work = Tally()
    started = threading.Event()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def body() -> str:
            if job.key == "long" and job.epoch == 1:
                started.set()
                _heartbeat_for(job, LONG_S)
            work.add(job.key)
            return "done"

        job.step("work", body)

    async def ahandle(message: Any, job: pubsub_worker.AsyncJob) -> None:
        async def body() -> str:
            if job.key == "long" and job.epoch == 1:
                started.set()
                await _aheartbeat_for(job, LONG_S)
            work.add(job.key)
            return "done"

        await job.step("work", body)

    chosen: Any = handle if flavour == "sync" else ahandle
    wrapped = pubsub_worker.exactly_once(chosen, settings=settings)
    with worker(wrapped, settings):
        publish_keys(publisher, eod_subscription.topic_path, ["long"])
        assert started.wait(30)
    released = doc_state(firestore_client, settings, "long")

    end_stale_streams(subscriber, eod_subscription.subscription_path)
    keys = ["new-0", "new-1", "new-2"]
    with worker(wrapped, settings):
        publish_keys(publisher, eod_subscription.topic_path, keys)
        wait_until(
            lambda: all(
                state is not None and state[0] == "completed"
                for state in states(firestore_client, settings, [*keys, "long"]).values()
            ),
            30,
        )

    assert released == ("released", 1, 0)
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert doc_state(firestore_client, settings, "long") == ("completed", 2, 1)
    assert work.as_dict() == dict.fromkeys([*keys, "long"], 1)


# -- 6. shutdown churn ---------------------------------------------------------------


def test_messages_published_while_run_drains_are_left_to_the_next_worker(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """A stop is requested while a long job runs and a completion's ack is under way.

    While ``run()`` drains (its grace is 8 s), three messages are published.
    This worker claims none of them: no job document exists for them when
    it has stopped (no attempt counted, nothing released). The next worker
    processes them at their first attempt, and completes the long job, which
    the first released with its attempt given back.
    """
    settings = settings_for(eod_subscription, key_attribute="op", shutdown_grace_seconds=8)
    work = Tally()
    long_started = threading.Event()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def body() -> str:
            if job.key == "long" and job.epoch == 1:
                long_started.set()
                _heartbeat_for(job, LONG_S)
            work.add(job.key)
            return "done"

        job.step("work", body)

    hooks = HoldingRecorder(lambda key: key == "concluding")
    first = RunningWorker(
        pubsub_worker.exactly_once(handle, settings=settings, hooks=hooks), settings
    )
    first.thread.start()
    late = ["late-0", "late-1", "late-2"]
    try:
        # Together: a claim sent with the held completion in one batch goes on while the
        # completion's conclusion (its before_ack) waits on a batch writer.
        publish_keys(publisher, eod_subscription.topic_path, ["concluding", "long"])
        assert wait_until(lambda: hooks.held == 1 and long_started.is_set(), 30)
        first.stop_event.set()  # run() stops: it drains, the long job runs its grace
        late_ids = publish_keys(publisher, eod_subscription.topic_path, late)
        draining = first.thread.is_alive()
        # A window for a draining worker that still pulls to take them.
        wait_until(lambda: any(hooks.deliveries[i] for i in late_ids), 3)
        hooks.go.set()
        first.thread.join(60)
    finally:
        hooks.go.set()
        first.stop()
    assert first.error is None
    assert draining

    left = states(firestore_client, settings, late)
    released = doc_state(firestore_client, settings, "long")
    concluded = doc_state(firestore_client, settings, "concluding")

    end_stale_streams(subscriber, eod_subscription.subscription_path)
    second = pubsub_worker.exactly_once(handle, settings=settings)
    everything = [*late, "long", "concluding"]
    with consuming(second, settings, "run"):
        wait_until(
            lambda: all(
                state is not None and state[0] == "completed"
                for state in states(firestore_client, settings, everything).values()
            )
        )

    assert left == dict.fromkeys(late), hooks.snapshot()
    assert released == ("released", 1, 0)
    assert concluded == ("completed", 1, 1)
    assert states(firestore_client, settings, late) == dict.fromkeys(late, ("completed", 1, 1))
    assert doc_state(firestore_client, settings, "long") == ("completed", 2, 1)
    assert work.as_dict() == dict.fromkeys(everything, 1)


def test_an_async_handler_cancelled_by_the_shutdown_gets_its_attempt_back(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """An ``async def`` handler awaiting a long call (not a ``job.*``) when ``run()`` stops.

    The shutdown (grace 1 s) cancels it: the job is released with its
    attempt given back (attempts stay 0, not counted as a retry), and the
    next worker completes it at its first counted attempt.
    """
    settings = settings_for(eod_subscription, key_attribute="op", shutdown_grace_seconds=1)
    hooks, work = Recorder(), Tally()
    started = threading.Event()

    async def handle(message: Any, job: pubsub_worker.AsyncJob) -> None:
        async def call() -> str:
            if job.epoch == 1:
                started.set()
                await asyncio.sleep(LONG_S)  # a slow HTTP call, say
            work.add(job.key)
            return "done"

        await job.step("call", call)

    first = pubsub_worker.exactly_once(handle, settings=settings, hooks=hooks)
    with worker(first, settings):
        (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
        assert started.wait(30)
    # The delivery concludes once its task is cancelled: wait until it has.
    wait_until(lambda: bool(hooks.outcomes.get(message_id)), 30)
    released = doc_state(firestore_client, settings, "job-0")

    end_stale_streams(subscriber, eod_subscription.subscription_path)
    second = pubsub_worker.exactly_once(handle, settings=settings)
    with worker(second, settings):
        wait_until(
            lambda: (doc_state(firestore_client, settings, "job-0") or ("",))[0] == "completed"
        )

    assert hooks.outcomes == {message_id: ["release"]}
    assert released == ("released", 1, 0)
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 2, 1)
    assert work.as_dict() == {"job-0": 1}
