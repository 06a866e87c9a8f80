"""The stock client's contract on every adoption path: what a callback may do still works wrapped.

``callback = pubsub_worker.exactly_once(callback)`` then
``subscriber.subscribe(path, callback=callback, ...)``: whatever
google-cloud-pubsub lets a callback do must work the same when wrapped. Each
test is a shape real subscriber code has (Pub/Sub's own samples, common
production code), run by the user's own ``SubscriberClient.subscribe`` and,
where the shape fits it, by :func:`pubsub_worker.run`, against the real
emulators, with exact counts: how often the work ran, the job documents,
and what Pub/Sub answered to each ack (with exactly-once delivery a
``SUCCESS`` is final). Shutdown paths are in ``test_shutdown_paths.py``.

A subscriber of these tests extends leases by the settings' lease (10 s,
``min``/``max_duration_per_lease_extension``, as :func:`pubsub_worker.run`
does): with exactly-once delivery the client would otherwise lease each
message 60 s at a time, and a lease that lapses in a test would show only a
minute later.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

import pubsub_worker
from emulator import Emulators, SubscriptionHandle, TcpProxy
from pubsub_worker import Counter as Metric
from pubsub_worker._job.keys import document_id
from tests.support.observe import assert_not_redelivered, step_epochs
from tests.support.processes import run_cli

from .conftest import RunningWorker, pull_all

pytestmark = pytest.mark.emulator

RUNNERS = pytest.mark.parametrize("runner", ["subscribe", "run"])
"""The user's own ``subscriber.subscribe(path, callback=wrapped)``, and ``pubsub_worker.run``."""

HANDOFF_WORK_S = 15.0
"""Work a pool thread does before it acks: longer than the 10 s lease, with no heartbeat."""

WAIT_S = 45.0
"""Bound on waiting for what a test expects; a test that waits this long fails on its counts."""


# -- what the tests observe ------------------------------------------------------------


class Recorder(pubsub_worker.Hooks):
    """What became of every delivery, as the library reports it through its hooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the three maps
        self.deliveries: Counter[str] = Counter()
        self.outcomes: defaultdict[str, list[str]] = defaultdict(list)
        self.answers: defaultdict[str, list[str]] = defaultdict(list)

    def received(self, message_id: str) -> None:
        with self._lock:
            self.deliveries[message_id] += 1

    def settled(self, message_id: str, outcome: str, answer: str | None) -> None:
        with self._lock:
            self.outcomes[message_id].append(outcome)
            if answer is not None:
                self.answers[message_id].append(answer)

    def answered(self, message_ids: list[str]) -> bool:
        """Pub/Sub answered an ack of each of ``message_ids``."""
        with self._lock:
            return all(self.answers.get(message_id) for message_id in message_ids)

    def snapshot(self) -> dict[str, Any]:
        """Everything recorded, for a failure message."""
        with self._lock:
            return {
                "deliveries": dict(self.deliveries),
                "outcomes": dict(self.outcomes),
                "answers": dict(self.answers),
            }


class HoldingRecorder(Recorder):
    """A :class:`Recorder` that holds ``before_ack`` of the keys ``hold`` picks until ``go``."""

    def __init__(self, hold: Callable[[str | None], bool]) -> None:
        super().__init__()
        self._hold = hold
        self.go = threading.Event()
        self._held = 0

    @property
    def held(self) -> int:
        """Deliveries that reached ``before_ack`` and were held (or still are)."""
        with self._lock:
            return self._held

    def before_ack(self, key: str | None, message_id: str) -> None:
        if not self._hold(key):
            return
        with self._lock:
            self._held += 1
        self.go.wait(WAIT_S)  # the job's record is durable; its ack waits for the test


class Tally:
    """How many times each piece of work ran. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _counts
        self._counts: Counter[str] = Counter()

    def add(self, name: str) -> int:
        """Count one run of ``name``; how many there have been, this one included."""
        with self._lock:
            self._counts[name] += 1
            return self._counts[name]

    def count(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class UserPool:
    """The user's own ``ThreadPoolExecutor`` that a callback hands its messages to.

    ``hand_off(work)`` is a stock-client callback: it submits ``work(message)``
    to the pool and returns at once. What a task raises is kept in ``errors``
    (a pool's future that nobody reads, as in most such code).
    """

    def __init__(self, threads: int = 4) -> None:
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="user-pool")
        self._lock = threading.Lock()  # guards errors
        self.errors: list[BaseException] = []
        self.closing = threading.Event()
        """Set when the test ends: long work returns early."""

    def hand_off(self, work: Callable[[Any], None]) -> Callable[[Any], None]:
        def callback(message: Any) -> None:
            self.executor.submit(self._run, work, message)

        return callback

    def _run(self, work: Callable[[Any], None], message: Any) -> None:
        try:
            work(message)
        except Exception as exc:
            with self._lock:
                self.errors.append(exc)

    def close(self) -> None:
        self.closing.set()
        self.executor.shutdown(wait=True, cancel_futures=True)


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def lease_flow(settings: pubsub_worker.Settings, **options: Any) -> Any:
    """The client's flow control, extending leases by the settings' lease (see the module doc)."""
    return pubsub_v1.types.FlowControl(
        min_duration_per_lease_extension=settings.lease_seconds,
        max_duration_per_lease_extension=settings.lease_seconds,
        **options,
    )


def job_doc(
    firestore_client: Any, settings: pubsub_worker.Settings, key: str
) -> dict[str, Any] | None:
    """The job document of ``key``, or None if there is none."""
    ref = firestore_client.collection(settings.collection).document(
        document_id(settings.subscription_path, key)
    )
    snap = ref.get()
    return dict(snap.to_dict() or {}) if snap.exists else None


def doc_state(
    firestore_client: Any, settings: pubsub_worker.Settings, key: str
) -> tuple[str, int, int] | None:
    """``(status, epoch, attempts)`` of ``key``'s job, or None if there is none."""
    doc = job_doc(firestore_client, settings, key)
    if doc is None:
        return None
    return str(doc["status"]), int(doc["epoch"]), int(doc["attempts"])


def states(
    firestore_client: Any, settings: pubsub_worker.Settings, keys: list[str]
) -> dict[str, tuple[str, int, int] | None]:
    return {key: doc_state(firestore_client, settings, key) for key in keys}


def publish_keys(publisher: Any, topic_path: str, keys: list[str]) -> list[str]:
    """Publish one message per key (attribute ``op``); their message ids, in order."""
    return [
        publisher.publish(topic_path, f"payload-{key}".encode(), op=key).result() for key in keys
    ]


def cli_env(emulators: Emulators, settings: pubsub_worker.Settings) -> dict[str, str]:
    """The environment an operator's shell has for ``pubsub-worker jobs``."""
    return {
        **os.environ,
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": settings.subscription_path,
        "PUBSUB_WORKER_COLLECTION": settings.collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": settings.key_attribute or "",
        "PUBSUB_WORKER_LEASE_SECONDS": str(settings.lease_seconds),
    }


def ack_answer(future: Any, timeout_s: float) -> str:
    """What an ack future says: ``SUCCESS``, the ``AcknowledgeStatus`` refused, or what raised."""
    try:
        status: AcknowledgeStatus = future.result(timeout=timeout_s)
    except AcknowledgeError as exc:
        return str(exc.error_code.name)
    except Exception as exc:
        return type(exc).__name__
    return str(status.name)


@contextmanager
def consuming(
    wrapped: pubsub_worker.ExactlyOnce,
    settings: pubsub_worker.Settings,
    runner: str,
    **subscribe_options: Any,
) -> Iterator[None]:
    """Consume the subscription with ``wrapped`` for the block, the way ``runner`` says.

    ``subscribe``: the user's own client, ``subscribe(path, callback=wrapped,
    **subscribe_options)``, ended as the README says (``drain()``, then
    ``cancel()``). ``run``: :func:`pubsub_worker.run` in a thread, stopped as
    by SIGTERM.
    """
    if runner == "run":
        running = RunningWorker(wrapped, settings)
        running.thread.start()
        try:
            yield
        finally:
            running.stop()
        assert running.error is None, f"run() failed: {running.error!r}"
        return
    client = pubsub_v1.SubscriberClient()
    options = {"flow_control": lease_flow(settings), **subscribe_options}
    future = client.subscribe(settings.subscription_path, callback=wrapped, **options)
    try:
        yield
    finally:
        try:
            wrapped.drain(30)
            future.cancel()
            future.result(timeout=30)
        finally:
            client.close()
            wrapped.close()


# -- 1. ack (or nack) from another thread after the callback returned ----------------


@RUNNERS
def test_ack_from_a_pool_thread_after_the_callback_returned_runs_the_work_once(
    runner: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """The callback hands the message to the user's pool and returns; a pool thread acks later.

    The work (15 s, no heartbeat) outlasts the 10 s lease. As the stock
    client keeps a message leased until it is acked, the wrapper keeps the
    message's Pub/Sub lease and the job's Firestore lease while the pool
    holds it (up to MAX_PROCESSING_SECONDS, 60 s here): the work runs once
    per job, the job is completed, each message is delivered once, acked
    once (``SUCCESS``) and never comes back.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work, pool = Recorder(), Tally(), UserPool()

    def process(message: Any) -> None:
        pool.closing.wait(HANDOFF_WORK_S)
        work.add(message.attributes["op"])
        message.ack()

    wrapped = pubsub_worker.exactly_once(pool.hand_off(process), settings=settings, hooks=hooks)
    keys = ["job-0", "job-1"]
    try:
        with consuming(wrapped, settings, runner):
            ids = publish_keys(publisher, eod_subscription.topic_path, keys)
            wait_until(
                lambda: hooks.answered(ids) and all(work.count(k) for k in keys),
                HANDOFF_WORK_S + WAIT_S,
            )
    finally:
        pool.close()

    assert pool.errors == []
    assert work.as_dict() == dict.fromkeys(keys, 1), hooks.snapshot()
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert hooks.deliveries == dict.fromkeys(ids, 1)
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


@RUNNERS
def test_nack_from_a_pool_thread_releases_the_job_and_the_redelivery_runs_it_again(
    runner: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """A pool thread nacks the first delivery and acks the second.

    The nack releases the job with its attempt counted; the redelivery
    runs the work again and completes it: two runs, two attempts, one ack.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work, pool = Recorder(), Tally(), UserPool()

    def process(message: Any) -> None:
        if work.add(message.attributes["op"]) == 1:
            message.nack()
        else:
            message.ack()

    wrapped = pubsub_worker.exactly_once(pool.hand_off(process), settings=settings, hooks=hooks)
    try:
        with consuming(wrapped, settings, runner):
            (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            wait_until(lambda: hooks.answered([message_id]))
    finally:
        pool.close()

    assert pool.errors == []
    assert work.as_dict() == {"job-0": 2}, hooks.snapshot()
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 2, 2)
    assert hooks.deliveries == {message_id: 2}
    assert hooks.outcomes == {message_id: ["retry", "complete"]}
    assert hooks.answers == {message_id: ["SUCCESS"]}


class LostInThePool(Exception):
    """The user's pool task failed before it acked or nacked; nobody reads its future."""


@RUNNERS
def test_a_message_the_pool_never_settles_comes_back_after_the_cap_as_a_failed_attempt(
    runner: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """The first delivery's pool task fails before it acks or nacks; the second one acks.

    As with the stock client, a message the pool holds stays leased and its
    job running (checked 3 s in, well inside the cap) until
    MAX_PROCESSING_SECONDS (10 s); it then comes back as a failed attempt
    (counted), and the redelivery completes the job at its second attempt.
    """
    settings = settings_for(eod_subscription, key_attribute="op", max_processing_seconds=10)
    hooks, work, pool = Recorder(), Tally(), UserPool()
    first_ran = threading.Event()

    def process(message: Any) -> None:
        if work.add(message.attributes["op"]) == 1:
            first_ran.set()
            raise LostInThePool("failed before ack() or nack()")
        message.ack()

    wrapped = pubsub_worker.exactly_once(pool.hand_off(process), settings=settings, hooks=hooks)
    try:
        with consuming(wrapped, settings, runner):
            (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            assert first_ran.wait(30)
            time.sleep(3.0)  # well inside the 10 s cap: the pool still holds the message
            held = doc_state(firestore_client, settings, "job-0")
            wait_until(lambda: hooks.answered([message_id]))
    finally:
        pool.close()

    assert held == ("running", 1, 1), hooks.snapshot()
    assert [type(e) for e in pool.errors] == [LostInThePool]
    assert work.as_dict() == {"job-0": 2}, hooks.snapshot()
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 2, 2)
    assert hooks.deliveries == {message_id: 2}
    assert hooks.answers == {message_id: ["SUCCESS"]}


@RUNNERS
def test_a_message_the_pool_never_settles_goes_to_review_once_with_max_attempts_1(
    runner: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """MAX_ATTEMPTS=1: a message whose pool task never settles it goes to review once.

    The job stays running while the pool holds the message (checked 3 s in,
    inside the 10 s cap); at the cap its one attempt has failed: the failure
    topic gets the message once, the job is ``failed`` (reason ``attempts``),
    the message is acked once and not delivered again.
    """
    review = make_subscription(exactly_once=False)
    settings = settings_for(
        eod_subscription,
        key_attribute="op",
        max_processing_seconds=10,
        max_attempts=1,
        failure_topic=review.topic_path,
    )
    hooks, work, pool = Recorder(), Tally(), UserPool()
    ran = threading.Event()

    def process(message: Any) -> None:
        work.add(message.attributes["op"])
        ran.set()
        raise LostInThePool("failed before ack() or nack()")

    wrapped = pubsub_worker.exactly_once(pool.hand_off(process), settings=settings, hooks=hooks)
    try:
        with consuming(wrapped, settings, runner):
            (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            assert ran.wait(30)
            time.sleep(3.0)  # well inside the 10 s cap: the pool still holds the message
            held = doc_state(firestore_client, settings, "job-0")
            wait_until(lambda: hooks.answered([message_id]))
    finally:
        pool.close()

    assert held == ("running", 1, 1), hooks.snapshot()
    assert work.as_dict() == {"job-0": 1}
    doc = job_doc(firestore_client, settings, "job-0")
    assert doc is not None
    assert (doc["status"], doc["reason"], doc["attempts"]) == ("failed", "attempts", 1)
    failed = pull_all(subscriber, review.subscription_path)
    assert [m.data for m in failed] == [b"payload-job-0"]
    assert failed[0].attributes["pubsub_worker_reason"] == "attempts"
    assert hooks.deliveries == {message_id: 1}
    assert hooks.answers == {message_id: ["SUCCESS"]}


@RUNNERS
def test_job_steps_from_a_pool_thread_are_recorded_once(
    runner: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """A pool thread runs ``message.job.step(...)`` twice, then acks: each step once, epoch 1."""
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work, pool = Recorder(), Tally(), UserPool()

    def process(message: Any) -> None:
        job = message.job

        def upload() -> str:
            work.add(f"upload:{job.key}")
            return f"u://{job.key}"

        url = job.step("upload", upload)
        job.step("notify", lambda: work.add(f"notify:{url}"))
        message.ack()

    wrapped = pubsub_worker.exactly_once(pool.hand_off(process), settings=settings, hooks=hooks)
    keys = ["job-0", "job-1", "job-2"]
    try:
        with consuming(wrapped, settings, runner):
            ids = publish_keys(publisher, eod_subscription.topic_path, keys)
            wait_until(lambda: hooks.answered(ids))
    finally:
        pool.close()

    assert pool.errors == []
    expected = {f"upload:{k}": 1 for k in keys} | {f"notify:u://{k}": 1 for k in keys}
    assert work.as_dict() == expected, hooks.snapshot()
    for key in keys:
        doc = job_doc(firestore_client, settings, key)
        assert doc is not None
        assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
        assert step_epochs(doc) == {"upload": 1, "notify": 1}
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}


# -- 2. ack_with_response() / nack_with_response() tell the truth ----------------------


@RUNNERS
def test_ack_with_response_in_the_callback_confirms_only_a_durable_completion(
    runner: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """Pub/Sub's exactly-once sample: ``ack_with_response().result(timeout=...)``, then count.

    The wait neither deadlocks nor outlasts the lease; it returns
    ``SUCCESS`` with the job document already ``completed``; each message is
    acked once and never comes back.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work = Recorder(), Tally()
    lock = threading.Lock()
    confirmed: dict[str, tuple[str, str | None]] = {}

    def callback(message: Any) -> None:
        key = message.attributes["op"]
        work.add(key)
        ack_future = message.ack_with_response()
        answer = ack_answer(ack_future, settings.lease_seconds)
        state = doc_state(firestore_client, settings, key)
        with lock:
            confirmed[key] = (answer, state[0] if state else None)

    wrapped = pubsub_worker.exactly_once(callback, settings=settings, hooks=hooks)
    keys = ["job-0", "job-1", "job-2"]
    with consuming(wrapped, settings, runner):
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        wait_until(lambda: len(confirmed) == len(keys) and hooks.answered(ids))

    assert confirmed == dict.fromkeys(keys, ("SUCCESS", "completed")), hooks.snapshot()
    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert hooks.deliveries == dict.fromkeys(ids, 1)
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}
    assert_not_redelivered(
        subscriber, eod_subscription.subscription_path, lease_s=settings.lease_seconds
    )


def test_ack_with_response_is_not_success_before_pubsub_answers_the_ack(
    emulators: Emulators,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user's subscriber reaches Pub/Sub through a link that goes silent before the ack.

    The completion is durable (Firestore is reachable), but Pub/Sub cannot
    answer the ack: ``ack_with_response().result(timeout=5)`` does not say
    ``SUCCESS`` (the stock client's future stays pending). Once the link
    carries bytes again the message is acked (its ack, or a redelivery's
    that finds the job done): the work ran once, one ``SUCCESS`` in all.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work = Recorder(), Tally()
    seen: list[tuple[str, tuple[str, int, int] | None]] = []
    with TcpProxy(emulators.pubsub_host or "") as link:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", link.address)  # the user's client, below

        def callback(message: Any) -> None:
            key = message.attributes["op"]
            if work.add(key) > 1:
                message.ack()
                return
            link.blackhole()
            try:
                answer = ack_answer(message.ack_with_response(), 5.0)
                seen.append((answer, doc_state(firestore_client, settings, key)))
            finally:
                link.blackhole(False)

        wrapped = pubsub_worker.exactly_once(callback, settings=settings, hooks=hooks)
        with consuming(wrapped, settings, "subscribe"):
            (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            wait_until(lambda: "SUCCESS" in hooks.answers.get(message_id, []))

    assert len(seen) == 1, hooks.snapshot()
    answer, state = seen[0]
    assert answer != "SUCCESS", hooks.snapshot()
    assert state == ("completed", 1, 1)  # durable; only the ack is unanswered
    assert work.as_dict() == {"job-0": 1}
    assert hooks.answers[message_id].count("SUCCESS") == 1
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 1, 1)


@pytest.mark.parametrize("where", ["callback", "pool"])
def test_ack_with_response_of_a_fenced_delivery_raises_invalid_ack_id(
    where: str,
    emulators: Emulators,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """The operator releases the job (``pubsub-worker jobs release``) before the callback acks.

    ``message.ack_with_response().result()`` of that fenced delivery raises
    ``AcknowledgeError(INVALID_ACK_ID)``, from the callback itself or from
    the pool thread it handed the message to, and nothing is recorded as
    completed by it: the one completion is the redelivery's, which claims
    the job at epoch 3.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, pool = Recorder(), UserPool()
    arrived, go = threading.Event(), threading.Event()
    lock = threading.Lock()
    seen: list[tuple[int, str]] = []

    def settle_it(message: Any) -> None:
        epoch = message.job.epoch
        if epoch == 1:
            arrived.set()
            go.wait(WAIT_S)
        answer = ack_answer(message.ack_with_response(), settings.lease_seconds)
        with lock:
            seen.append((epoch, answer))

    callback = settle_it if where == "callback" else pool.hand_off(settle_it)
    wrapped = pubsub_worker.exactly_once(callback, settings=settings, hooks=hooks)
    try:
        with consuming(wrapped, settings, "subscribe"):
            publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            assert arrived.wait(30)
            released = run_cli(
                cli_env(emulators, settings), "jobs", "release", "job-0", "--epoch", "1"
            )
            go.set()
            assert released.returncode == 0, released.stdout + released.stderr
            assert released.stdout.splitlines()[0] == (
                "released job-0: epoch 1 -> 2, status running -> released"
            )
            wait_until(lambda: len(seen) >= 2)
    finally:
        go.set()
        pool.close()

    assert seen == [(1, "INVALID_ACK_ID"), (3, "SUCCESS")], hooks.snapshot()
    assert pool.errors == []
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 3, 2)
    assert wrapped.metrics.get(Metric.COMPLETED) == 1


@pytest.mark.parametrize("where", ["callback", "pool"])
def test_nack_with_response_resolves_success_once_the_release_is_durable(
    where: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``nack_with_response().result()`` returns ``SUCCESS`` with the job already released.

    From the callback and from a pool thread: when the future resolves the
    job is ``released`` with its attempt counted; the redelivery completes it.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, pool = Recorder(), UserPool()
    lock = threading.Lock()
    seen: list[tuple[int, str, tuple[str, int, int] | None]] = []

    def settle_it(message: Any) -> None:
        attempt = message.job.attempt
        if attempt > 1:
            message.ack()
            return
        answer = ack_answer(message.nack_with_response(), settings.lease_seconds)
        with lock:
            seen.append((attempt, answer, doc_state(firestore_client, settings, "job-0")))

    callback = settle_it if where == "callback" else pool.hand_off(settle_it)
    wrapped = pubsub_worker.exactly_once(callback, settings=settings, hooks=hooks)
    try:
        with consuming(wrapped, settings, "subscribe"):
            (message_id,) = publish_keys(publisher, eod_subscription.topic_path, ["job-0"])
            wait_until(lambda: bool(seen) and hooks.answered([message_id]))
    finally:
        pool.close()

    # Read once the future resolved: the release had landed (the redelivery may have claimed
    # the job since), never the first claim still running.
    after_release = {("released", 1, 1), ("running", 2, 2), ("completed", 2, 2)}
    assert [(attempt, answer) for attempt, answer, _ in seen] == [(1, "SUCCESS")], hooks.snapshot()
    assert seen[0][2] in after_release
    assert pool.errors == []
    assert doc_state(firestore_client, settings, "job-0") == ("completed", 2, 2)
    assert hooks.deliveries == {message_id: 2}
    assert hooks.answers == {message_id: ["SUCCESS"]}


# -- 3. a callback that publishes through message.job, outside any step ----------------


@pytest.mark.parametrize("flavour", ["async", "sync"])
@RUNNERS
def test_a_callback_publishing_outside_a_step_then_acking_publishes_once(
    flavour: str,
    runner: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``message.job.publish(topic, data)`` outside any step, then ``message.ack()``.

    An ``async def callback(message)`` (and the same callback written sync):
    the output is published exactly once per job (counted on a subscription
    of the output topic, pulled until quiet), its outbox entry is committed
    and marked sent, and the job is completed.
    """
    out = make_subscription(exactly_once=False)
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work = Recorder(), Tally()

    async def acallback(message: Any) -> None:
        work.add(message.attributes["op"])
        message.job.publish(out.topic_path, b"output:" + message.data, source="adoption")
        await asyncio.sleep(0)
        message.ack()

    def callback(message: Any) -> None:
        work.add(message.attributes["op"])
        message.job.publish(out.topic_path, b"output:" + message.data, source="adoption")
        message.ack()

    chosen: Any = acallback if flavour == "async" else callback
    wrapped = pubsub_worker.exactly_once(chosen, settings=settings, hooks=hooks)
    keys = ["job-0", "job-1", "job-2"]
    with consuming(wrapped, settings, runner):
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        wait_until(lambda: hooks.answered(ids))

    outputs = pull_all(subscriber, out.subscription_path)
    assert sorted(m.data for m in outputs) == [f"output:payload-{k}".encode() for k in keys]
    assert len({m.attributes["effect_key"] for m in outputs}) == len(keys)
    assert work.as_dict() == dict.fromkeys(keys, 1)
    for key in keys:
        doc = job_doc(firestore_client, settings, key)
        assert doc is not None
        assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
        assert [entry["sent"] for entry in (doc.get("outbox") or {}).values()] == [True]
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}


# -- 4. the client's own options keep their meaning when wrapped ------------------------


class Concurrency:
    """How many handlers run at once; each waits (up to 2 s) for ``target`` to be reached."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._cond = threading.Condition()  # guards now and most
        self.now = 0
        self.most = 0

    @contextmanager
    def inside(self) -> Iterator[None]:
        with self._cond:
            self.now += 1
            self.most = max(self.most, self.now)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.now >= self._target, timeout=2.0)
        try:
            yield
            time.sleep(0.2)  # still inside: a handler let in beyond the limit would overlap
        finally:
            with self._cond:
                self.now -= 1


FLOW_LIMIT = 3
FLOW_MESSAGES = 12


@pytest.mark.parametrize("shape", ["callback", "job", "handoff"])
def test_flow_control_max_messages_3_limits_concurrent_handlers_to_3(
    shape: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``FlowControl(max_messages=3)`` on the user's subscribe: never more than 3 at once, and 3.

    Measured inside the handler: a callback that acks, a job-style handler,
    and a callback that hands the message to a pool of 8 threads (where the
    stock client counts the message until the pool thread acks it). Each
    handler leaves the measured section before it acks or returns.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work, pool = Recorder(), Tally(), UserPool(threads=8)
    gauge = Concurrency(FLOW_LIMIT)

    def callback(message: Any) -> None:
        with gauge.inside():
            work.add(message.attributes["op"])
        message.ack()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        with gauge.inside():
            job.step("work", lambda: work.add(job.key))

    handler: Any = {"callback": callback, "job": handle, "handoff": pool.hand_off(callback)}[shape]
    wrapped = pubsub_worker.exactly_once(handler, settings=settings, hooks=hooks)
    keys = [f"job-{n}" for n in range(FLOW_MESSAGES)]
    try:
        flow = lease_flow(settings, max_messages=FLOW_LIMIT)
        with consuming(wrapped, settings, "subscribe", flow_control=flow):
            ids = publish_keys(publisher, eod_subscription.topic_path, keys)
            wait_until(lambda: hooks.answered(ids) and all(work.count(k) for k in keys))
    finally:
        pool.close()

    assert gauge.most == FLOW_LIMIT, hooks.snapshot()
    assert pool.errors == []
    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}


@pytest.mark.parametrize("shape", ["callback", "job"])
def test_a_custom_thread_scheduler_runs_the_handlers_on_the_users_threads(
    shape: str,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    """``scheduler=ThreadScheduler(ThreadPoolExecutor(4, thread_name_prefix="mine"))``.

    The handler, and the function of each step it runs, run on the user's
    threads; every job is completed once.
    """
    settings = settings_for(eod_subscription, key_attribute="op")
    hooks, work = Recorder(), Tally()
    lock = threading.Lock()
    threads: list[str] = []

    def note(key: str) -> None:
        with lock:
            threads.append(threading.current_thread().name)
        work.add(key)

    def callback(message: Any) -> None:
        note(message.attributes["op"])
        message.ack()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        note(job.key)
        job.step("work", lambda: note(f"step:{job.key}"))

    handler: Any = callback if shape == "callback" else handle
    wrapped = pubsub_worker.exactly_once(handler, settings=settings, hooks=hooks)
    scheduler = ThreadScheduler(ThreadPoolExecutor(4, thread_name_prefix="mine"))
    keys = [f"job-{n}" for n in range(6)]
    with consuming(wrapped, settings, "subscribe", scheduler=scheduler):
        ids = publish_keys(publisher, eod_subscription.topic_path, keys)
        wait_until(lambda: hooks.answered(ids))

    runs = dict.fromkeys(keys, 1)
    if shape == "job":
        runs |= {f"step:{k}": 1 for k in keys}
    assert work.as_dict() == runs, hooks.snapshot()
    assert len(threads) == len(runs)
    assert [name for name in threads if not name.startswith("mine_")] == []
    assert states(firestore_client, settings, keys) == dict.fromkeys(keys, ("completed", 1, 1))
    assert hooks.answers == {i: ["SUCCESS"] for i in ids}
