"""The wrapper against the real emulators, in one process: the paths without a crash."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker._job.failure import rejected_document_id
from pubsub_worker._job.keys import document_id
from pubsub_worker.stores.base import shard_of

from .conftest import pull_all

pytestmark = pytest.mark.emulator


def job_doc(firestore_client: Any, settings: pubsub_worker.Settings, key: str) -> dict[str, Any]:
    doc_id = document_id(settings.subscription_path, key)
    snap = firestore_client.collection(settings.collection).document(doc_id).get()
    assert snap.exists, f"no job document for key {key!r}"
    return snap.to_dict()  # type: ignore[no-any-return]


def test_steps_run_once_and_the_job_is_completed_before_the_ack(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    calls: list[tuple[str, str, int]] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def upload() -> str:
            calls.append(("upload", job.key, job.epoch))
            return "u://1"

        url = job.step("upload", upload)

        def notify() -> dict[str, bool]:
            calls.append(("notify", url, job.epoch))
            return {"sent": True}

        job.step("notify", notify)

    with worker(handle, settings) as w:
        for n in range(3):
            publisher.publish(eod_subscription.topic_path, b"same", op=f"op-{n}").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 3)
    assert sorted(calls) == sorted(
        [("upload", f"op-{n}", 1) for n in range(3)] + [("notify", "u://1", 1)] * 3
    )
    doc = job_doc(firestore_client, settings, "op-1")
    assert doc["status"] == "completed"
    assert (doc["epoch"], doc["attempts"]) == (1, 1)
    assert set(doc["steps"]) == {"upload", "notify"}
    assert doc["steps"]["notify"]["result"] == '{"sent":true}'
    assert doc["key"] == "op-1"
    assert pull_all(subscriber, eod_subscription.subscription_path) == []  # all acked


def test_one_key_published_twice_runs_once(
    publisher: Any,
    subscriber: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    runs: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def charge() -> int:
            runs.append(message.message_id)
            return 1

        job.step("charge", charge)

    with worker(handle, settings) as w:
        for _ in range(2):
            publisher.publish(eod_subscription.topic_path, b"pay 10", op="order-7").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) + w.counter(Counter.ALREADY_DONE) == 2)
        assert w.counter(Counter.COMPLETED) == 1
        assert w.counter(Counter.ALREADY_DONE) == 1
    assert len(runs) == 1
    assert pull_all(subscriber, eod_subscription.subscription_path) == []


def test_an_existing_message_callback_works_unchanged(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    settings = settings_for(eod_subscription)
    seen: list[bytes] = []
    nacked_once: list[str] = []

    def callback(message: Any) -> None:  # written for the stock client
        if message.data == b"retry-me" and not nacked_once:
            nacked_once.append(message.message_id)
            message.nack()
            return
        seen.append(message.data)
        message.ack()

    with worker(callback, settings) as w:
        ids = [
            publisher.publish(eod_subscription.topic_path, data).result()
            for data in (b"hello", b"retry-me")
        ]
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 2)
        assert w.counter(Counter.RETRIED) == 1
    assert sorted(seen) == [b"hello", b"retry-me"]
    retried = job_doc(firestore_client, settings, ids[1])
    assert retried["status"] == "completed"
    assert retried["attempts"] == 2
    assert pull_all(subscriber, eod_subscription.subscription_path) == []


@pytest.mark.parametrize(
    "key",
    ["a/b/../c", "..", "__name__", "x" * 1024, "ключ ✓"],
    ids=["slashes", "dotdot", "dunder", "1KiB-the-longest-value-Pub-Sub-allows", "unicode"],
)
def test_hostile_keys_are_processed_under_their_own_hashed_document(
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    key: str,
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    runs: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def only() -> int:
            runs.append(job.key)
            return 1

        job.step("only", only)

    with worker(handle, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"x", op=key).result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1)
    assert runs == [key]
    doc = job_doc(firestore_client, settings, key)
    assert doc["status"] == "completed"
    assert len(doc["key"].encode()) <= 1024 + 3  # stored for humans, clipped
    # nothing else was written in the collection (no raw key became a path)
    docs = list(firestore_client.collection(settings.collection).stream())
    assert [d.id for d in docs] == [document_id(settings.subscription_path, key)]


def test_missing_key_attribute_goes_to_the_failure_path_never_to_a_fallback_key(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    review = make_subscription(exactly_once=False)
    settings = settings_for(eod_subscription, key_attribute="op", failure_topic=review.topic_path)
    runs: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        runs.append(job.key)

    with worker(handle, settings) as w:
        message_id = publisher.publish(
            eod_subscription.topic_path, b"no key here", other="1"
        ).result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 1)
    assert runs == []
    failed = pull_all(subscriber, review.subscription_path)
    assert len(failed) == 1
    assert failed[0].data == b"no key here"
    assert failed[0].attributes["other"] == "1"
    assert failed[0].attributes["pubsub_worker_reason"] == "missing_key"
    assert failed[0].attributes["pubsub_worker_message_id"] == message_id
    doc_id = rejected_document_id(settings.subscription_path, message_id)
    record = firestore_client.collection(settings.collection).document(doc_id).get().to_dict()
    assert record["status"] == "failed"
    assert record["shard"] == shard_of(doc_id)  # listed by `jobs list` like a job
    assert record["reason"] == "missing_key"
    assert record["data"] == b"no key here"
    assert pull_all(subscriber, eod_subscription.subscription_path) == []  # acked


def test_same_key_with_another_payload_is_rejected_for_review(
    publisher: Any,
    subscriber: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    review = make_subscription(exactly_once=False)
    settings = settings_for(eod_subscription, key_attribute="op", failure_topic=review.topic_path)
    runs: list[bytes] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def apply() -> int:
            runs.append(message.data)
            return 1

        job.step("apply", apply)

    with worker(handle, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"amount=10", op="order-1").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1)
        publisher.publish(eod_subscription.topic_path, b"amount=99", op="order-1").result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 1)
    assert runs == [b"amount=10"]
    failed = pull_all(subscriber, review.subscription_path)
    assert [m.data for m in failed] == [b"amount=99"]
    assert failed[0].attributes["pubsub_worker_reason"] == "payload_conflict"
    assert failed[0].attributes["pubsub_worker_key"] == "order-1"


def test_a_subscription_without_exactly_once_is_refused_at_start(
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    plain = make_subscription(exactly_once=False)
    wrapped = pubsub_worker.exactly_once(lambda m, j: None, settings=settings_for(plain))
    with pytest.raises(pubsub_worker.ConfigError, match="exactly-once"):
        wrapped.start()
    with pytest.raises(pubsub_worker.ConfigError, match="ALLOW_AT_LEAST_ONCE"):
        pubsub_worker.run(lambda m, j: None, settings=settings_for(plain))


def test_at_least_once_is_accepted_when_allowed_with_one_loud_warning(
    publisher: Any,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain = make_subscription(exactly_once=False)
    settings = settings_for(plain, allow_at_least_once=True)
    runs: list[str] = []
    caplog.set_level(logging.WARNING, logger="pubsub_worker")

    def record_run(job: pubsub_worker.Job) -> int:
        runs.append(job.key)
        return 1

    with worker(lambda m, j: j.step("s", lambda: record_run(j)), settings) as w:
        for _ in range(2):
            publisher.publish(plain.topic_path, b"x").result()
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == 2)
    assert len(runs) == 2
    warnings = [r for r in caplog.records if "ALLOW_AT_LEAST_ONCE" in r.getMessage()]
    assert len(warnings) == 1


def test_an_unreachable_firestore_fails_at_start_with_a_clear_error(
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", f"127.0.0.1:{port}")
    wrapped = pubsub_worker.exactly_once(lambda m, j: None, settings=settings_for(eod_subscription))
    with pytest.raises(pubsub_worker.Unreachable, match=f"127.0.0.1:{port}"):
        wrapped.start()


def test_an_unreachable_pubsub_fails_at_start_with_a_clear_error(
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    with pytest.raises(pubsub_worker.Unreachable, match="PUBSUB_EMULATOR_HOST"):
        pubsub_worker.run(lambda m, j: None, settings=settings_for(eod_subscription))


def test_a_callback_records_its_jobs_under_the_subscription_it_consumes_or_refuses(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two subscriptions of one topic, A and its sibling B. A callback configured for A
    (``PUBSUB_WORKER_SUBSCRIPTION``) but subscribed to B refuses B's messages (logged,
    left unacked, nothing recorded) instead of recording B's jobs under A, where A's own
    worker would later take them for done and ack them without running them."""
    sibling = eod_subscription.subscription_path + "-sibling"
    subscriber.create_subscription(
        request={
            "name": sibling,
            "topic": eod_subscription.topic_path,
            "ack_deadline_seconds": 10,
            "enable_exactly_once_delivery": True,
        }
    )
    settings = settings_for(eod_subscription, key_attribute="op")
    ran: dict[str, list[str]] = {"A": [], "B": []}

    def handler_for(name: str) -> Any:
        def handle(message: Any, job: pubsub_worker.Job) -> None:
            job.step("charge", lambda: ran[name].append(job.key))

        return handle

    try:
        on_b = pubsub_worker.exactly_once(handler_for("B"), settings=settings)
        on_b.start(check_subscription=False)
        streaming = subscriber.subscribe(sibling, callback=on_b)
        for n in range(3):
            publisher.publish(eod_subscription.topic_path, b"x", op=f"order-{n}").result()
        deadline = time.monotonic() + 30
        while caplog.text.count(f"the message comes from {sibling}") < 3:
            assert time.monotonic() < deadline, "the sibling's messages were not refused"
            time.sleep(0.1)
        streaming.cancel()
        streaming.result(timeout=10)
        on_b.close()
        assert ran["B"] == []
        for n in range(3):
            doc_id = document_id(settings.subscription_path, f"order-{n}")
            snap = firestore_client.collection(settings.collection).document(doc_id).get()
            assert not snap.exists  # nothing recorded under A by B's worker

        with worker(handler_for("A"), settings) as w:
            w.wait_for(lambda: w.counter(Counter.COMPLETED) == 3)
        assert sorted(ran["A"]) == [f"order-{n}" for n in range(3)]  # A's own jobs ran
    finally:
        subscriber.delete_subscription(request={"subscription": sibling})
