"""The effect tools in one process against the real emulators: ``job.transactional_step``,
``job.publish`` (the outbox) and ``job.idempotency_key``, including the retries a
transaction goes through (contention, a commit whose reply was lost)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from google.api_core.exceptions import ServiceUnavailable
from google.cloud import firestore

import pubsub_worker
from emulator import Emulators, SubscriptionHandle, unique_id
from pubsub_worker import Counter
from pubsub_worker._job.keys import document_id
from pubsub_worker._support import clients

from .conftest import pull_all

pytestmark = pytest.mark.emulator


def job_doc(firestore_client: Any, settings: pubsub_worker.Settings, key: str) -> dict[str, Any]:
    doc_id = document_id(settings.subscription_path, key)
    snap = firestore_client.collection(settings.collection).document(doc_id).get()
    assert snap.exists, f"no job document for key {key!r}"
    return dict(snap.to_dict())


class CheckingPublisher:
    """A publisher that records, at publish time, what the job document held."""

    def __init__(self, firestore_client: Any, settings: pubsub_worker.Settings) -> None:
        self._real = clients.publisher_client(settings)
        self._firestore = firestore_client
        self._settings = settings
        self.seen_at_publish: list[dict[str, Any]] = []

    def publish(self, topic: str, data: bytes, **attributes: str) -> Any:
        key = attributes["effect_key"].split(":")[0]
        self.seen_at_publish.append(job_doc(self._firestore, self._settings, key))
        return self._real.publish(topic, data, **attributes)


def test_the_business_write_the_step_and_the_outbox_entry_commit_together(
    subscriber: Any,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    out = make_subscription(exactly_once=False, prefix="out")
    sink = firestore_client.collection(unique_id("sink"))
    settings = settings_for(eod_subscription, key_attribute="op")
    checking = CheckingPublisher(firestore_client, settings)
    keys: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        keys.append(job.idempotency_key("store"))

        def store(transaction: Any) -> str:
            transaction.set(sink.document(job.key), {"epoch": job.epoch})
            job.publish(out.topic_path, b"stored", kind="thumbnail")
            return "stored"

        assert job.transactional_step("store", store) == "stored"

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, publisher=checking)
    with worker(wrapped, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"attachment", op="op-1").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1)

    assert keys == ["op-1:store"]
    assert sink.document("op-1").get().to_dict() == {"epoch": 1}
    # Published only after the step, its outbox entry and the business write were durable.
    (at_publish,) = checking.seen_at_publish
    assert at_publish["steps"]["store"]["epoch"] == 1
    assert [e["sent"] for e in at_publish["outbox"].values()] == [False]
    (message,) = pull_all(subscriber, out.subscription_path)
    assert (message.data, dict(message.attributes)) == (
        b"stored",
        {"kind": "thumbnail", "effect_key": "op-1:store:0", "pubsub_worker_step": "store"},
    )
    doc = job_doc(firestore_client, settings, "op-1")
    assert doc["status"] == "completed"
    assert [e["sent"] for e in doc["outbox"].values()] == [True]


def test_a_transaction_retried_after_contention_publishes_its_output_once(
    subscriber: Any,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """Two jobs update one shared document; the emulator aborts one commit, the client
    runs that transaction again (the step function and its ``job.publish`` included)."""
    out = make_subscription(exactly_once=False, prefix="out")
    shared = firestore_client.collection(unique_id("sink")).document("claim-7")
    shared.set({"attachments": 0})
    settings = settings_for(eod_subscription, key_attribute="op")
    both_read = threading.Barrier(2, timeout=20)
    calls: dict[str, int] = {}

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def count(transaction: Any) -> int:
            calls[job.key] = calls.get(job.key, 0) + 1
            seen = shared.get(transaction=transaction).get("attachments")
            if calls[job.key] == 1:
                both_read.wait()  # both transactions hold a read of the document
            transaction.update(shared, {"attachments": seen + 1})
            job.publish(out.topic_path, job.key.encode())
            return int(seen + 1)

        job.transactional_step("count", count)

    with worker(handle, settings) as w:
        for key in ("op-1", "op-2"):
            publisher.publish(eod_subscription.topic_path, b"attachment", op=key).result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 2, timeout_s=60)

    assert sum(calls.values()) > 2  # a commit was aborted and its transaction run again
    assert shared.get().get("attachments") == 2
    outputs = pull_all(subscriber, out.subscription_path)
    assert sorted(m.attributes["effect_key"] for m in outputs) == [
        "op-1:count:0",
        "op-2:count:0",
    ]


def test_a_commit_whose_reply_was_lost_is_not_run_again(
    emulators: Emulators,
    subscriber: Any,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """The commit lands but the client sees UNAVAILABLE (the connection dropped after the
    request was sent), and retries: the step is found recorded at this epoch and adopted."""
    out = make_subscription(exactly_once=False, prefix="out")
    sink = firestore_client.collection(unique_id("sink"))
    settings = settings_for(eod_subscription, key_attribute="op")
    client = firestore.Client(project=emulators.project)  # the worker's own, with the fault
    api = client._firestore_api
    real_commit = api.commit
    lost: list[str] = []

    def commit(*args: Any, request: Any, **kwargs: Any) -> Any:
        response = real_commit(*args, request=request, **kwargs)
        if request.get("transaction") and not lost:
            lost.append("reply lost")
            raise ServiceUnavailable(  # type: ignore[no-untyped-call]
                "connection reset after the commit was sent"
            )
        return response

    api.commit = commit
    runs: list[str] = []
    results: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def store(transaction: Any) -> str:
            ref = sink.document()  # a new id per run: a second landing would show
            runs.append(ref.id)
            transaction.set(ref, {"key": job.key, "epoch": job.epoch})
            job.publish(out.topic_path, b"stored")
            return str(ref.id)

        results.append(job.transactional_step("store", store))

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, firestore_client=client)
    try:
        with worker(wrapped, settings) as w:
            publisher.publish(eod_subscription.topic_path, b"attachment", op="op-1").result()
            w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1)
            assert w.counter(Counter.RETRIED) == 0  # settled in place, not by a redelivery
    finally:
        client.close()  # type: ignore[no-untyped-call]

    assert lost == ["reply lost"]
    assert len(runs) == 1
    assert results == runs  # the recorded result of the run that landed
    assert [d.id for d in sink.stream()] == runs
    assert [m.attributes["effect_key"] for m in pull_all(subscriber, out.subscription_path)] == [
        "op-1:store:0"
    ]


def test_an_error_raised_inside_the_transaction_is_the_callback_s_not_contention(
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op", max_attempts=1)
    calls: list[int] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def parse(transaction: Any) -> None:
            calls.append(1)
            int("not a number")  # ValueError, like a bad payload found mid-transaction

        job.transactional_step("parse", parse)

    started = time.monotonic()
    with worker(handle, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"attachment", op="op-1").result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 1)
    assert time.monotonic() - started < 10  # not retried for the store's 30 s as contention
    assert calls == [1]
    doc = job_doc(firestore_client, settings, "op-1")
    assert doc["status"] == "failed"
    assert doc["error"].startswith("ValueError: invalid literal for int()")


class FailingPublisher:
    """Publishes for real, except that the first ``times`` publishes of ``fail_data`` raise."""

    def __init__(self, settings: pubsub_worker.Settings, fail_data: bytes, times: int) -> None:
        self._real = clients.publisher_client(settings)
        self._fail_data = fail_data
        self._times = times

    def publish(self, topic: str, data: bytes, **attributes: str) -> Any:
        if data == self._fail_data and self._times > 0:
            self._times -= 1
            raise ServiceUnavailable("Pub/Sub did not answer")  # type: ignore[no-untyped-call]
        return self._real.publish(topic, data, **attributes)


def test_a_redelivery_publishes_only_the_entries_not_marked_sent(
    subscriber: Any,
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """Step ``first`` published and marked sent, step ``second`` committed but not
    published (its publish failed, and failed again when the job tried to complete): the
    job is released, not completed, and the next delivery publishes ``second`` only."""
    out = make_subscription(exactly_once=False, prefix="out")
    settings = settings_for(eod_subscription, key_attribute="op")
    ran: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        for name in ("first", "second"):

            def produce(name: str = name) -> str:
                ran.append(name)
                job.publish(out.topic_path, name.encode())
                return name

            job.step(name, produce)

    failing = FailingPublisher(settings, fail_data=b"second", times=2)
    wrapped = pubsub_worker.exactly_once(handle, settings=settings, publisher=failing)
    with worker(wrapped, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"attachment", op="op-1").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1, timeout_s=60)
        assert w.counter(Counter.RETRIED) == 1  # released once, without counting an attempt
        assert w.counter(Counter.OUTBOX_ERRORS) == 2
        assert w.counter(Counter.OUTBOX_PUBLISHED) == 2

    assert ran == ["first", "second"]  # neither step ran again
    outputs = pull_all(subscriber, out.subscription_path)
    assert sorted((m.data, m.attributes["effect_key"]) for m in outputs) == [
        (b"first", "op-1:first:0"),
        (b"second", "op-1:second:0"),
    ]


def test_an_outbox_publish_that_failed_is_sent_before_the_job_completes(
    subscriber: Any,
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """The handler caught the failed publish of its step; the completion publishes it first."""
    out = make_subscription(exactly_once=False, prefix="out")
    settings = settings_for(eod_subscription, key_attribute="op")
    raised: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        try:
            job.step("send", lambda: job.publish(out.topic_path, b"report"))
        except Exception as exc:  # a handler that swallows errors must not lose the entry
            raised.append(repr(exc))

    failing = FailingPublisher(settings, fail_data=b"report", times=1)
    wrapped = pubsub_worker.exactly_once(handle, settings=settings, publisher=failing)
    with worker(wrapped, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"attachment", op="op-2").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1)
        assert (w.counter(Counter.OUTBOX_ERRORS), w.counter(Counter.RETRIED)) == (1, 0)

    assert raised == []  # the step's commit stood; the publish is the library's to retry
    outputs = pull_all(subscriber, out.subscription_path)
    assert [(m.data, m.attributes["effect_key"]) for m in outputs] == [(b"report", "op-2:send:0")]
