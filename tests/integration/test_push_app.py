"""The push endpoint in process, against the real Firestore and Pub/Sub emulators.

Requests go through httpx's ASGI transport to :class:`pubsub_worker.push.PushApp`;
the job documents, the failure topic and the store are real. Each "endpoint"
is one app with a runtime of its own, as one server process would be.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from emulator.bootstrap import set_push
from emulator.topology import PushSpec
from pubsub_worker._ops.push_check import is_push, push_findings
from pubsub_worker._support import clients
from pubsub_worker.push import PushApp, create_app
from tests.support.observe import job_document, pull_now
from tests.unit.push.tokens import AUDIENCE, SERVICE_ACCOUNT, TestKeys, verifier

pytestmark = pytest.mark.emulator


def envelope(handle: SubscriptionHandle, message_id: str, data: bytes = b"x", **attrs: str) -> Any:
    return {
        "message": {
            "data": base64.b64encode(data).decode(),
            "attributes": attrs,
            "messageId": message_id,
            "publishTime": "2026-12-01T09:35:32.123Z",
        },
        "subscription": handle.subscription_path,
    }


async def _post(app: PushApp, bodies: list[Any]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://push", timeout=60) as c:
        return list(await asyncio.gather(*(c.post("/", json=body) for body in bodies)))


def post(app: PushApp, *bodies: Any) -> list[httpx.Response]:
    """POST each body at once (concurrently); the answers in order."""
    return asyncio.run(_post(app, list(bodies)))


@pytest.fixture
def push_subscription(make_subscription: Any) -> SubscriptionHandle:
    handle: SubscriptionHandle = make_subscription(exactly_once=False)
    return handle


@pytest.fixture
def endpoints(
    emulators: Emulators,
    push_subscription: SubscriptionHandle,
    firestore_collection: str,
    firestore_client: Any,
) -> Iterator[Any]:
    """``endpoints(handler, **settings)``: a push app on this test's subscription and collection."""
    made: list[PushApp] = []

    def make(handler: Any, **overrides: Any) -> PushApp:
        values: dict[str, Any] = {
            "subscription": push_subscription.subscription_path,
            "collection": firestore_collection,
            "key_attribute": "op",
            "lease_seconds": 10,
            "ack_timeout_seconds": 10,
            "push_verify_token": False,
            **overrides,
        }
        app = create_app(
            handler, settings=pubsub_worker.Settings(**values), firestore_client=firestore_client
        )
        app.start()
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def test_duplicates_under_one_key_run_once(
    endpoints: Any, push_subscription: SubscriptionHandle, firestore_client: Any
) -> None:
    runs: list[str] = []
    lock = threading.Lock()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def charge() -> str:
            with lock:
                runs.append(message.message_id)
            time.sleep(0.2)
            return "charged"

        job.step("charge", charge)

    app = endpoints(handle)
    bodies = [envelope(push_subscription, str(n), op="order-1") for n in range(1, 7)]
    answers = post(app, *bodies)
    assert [a.status_code for a in answers] == [200] * 6
    outcomes = sorted(a.json()["outcome"] for a in answers)
    assert outcomes == ["ack"] * 5 + ["complete"]
    assert len(runs) == 1
    doc = job_document(
        firestore_client,
        app.deliveries.settings.collection,
        push_subscription.subscription_path,
        "order-1",
    )
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)


def test_a_job_owned_by_a_live_lease_elsewhere_is_answered_503_then_completes(
    endpoints: Any, push_subscription: SubscriptionHandle
) -> None:
    release = threading.Event()
    entered = threading.Event()
    runs: list[str] = []

    def slow(message: Any, job: pubsub_worker.Job) -> None:
        def work() -> str:
            entered.set()
            while not release.wait(0.2):
                job.heartbeat()
            runs.append("slow")
            return "done"

        job.step("work", work)

    # A 30 s deadline: the holder's request may run 24 s, the other polls its lease 10 s.
    first = endpoints(slow, lease_seconds=30)
    second = endpoints(lambda message, job: runs.append("second"), lease_seconds=30)
    answer: list[httpx.Response] = []
    holder = threading.Thread(
        target=lambda: answer.extend(post(first, envelope(push_subscription, "1", op="k")))
    )
    holder.start()
    assert entered.wait(30)
    started = time.monotonic()
    busy = post(second, envelope(push_subscription, "2", op="k"))[0]
    waited = time.monotonic() - started
    assert busy.status_code == 503
    assert busy.json()["outcome"] == "defer"
    assert "another owner holds a live lease" in busy.json()["why"]
    assert int(busy.headers["retry-after"]) >= 10
    assert waited >= 5  # it polled the lease before answering: never a hot retry
    release.set()
    holder.join(30)
    assert answer[0].status_code == 200
    again = post(second, envelope(push_subscription, "2", op="k"))[0]
    assert (again.status_code, again.json()["outcome"]) == (200, "ack")
    assert runs == ["slow"]


def test_a_request_that_would_outlive_its_deadline_is_released_not_half_done(
    endpoints: Any, push_subscription: SubscriptionHandle, firestore_client: Any
) -> None:
    done: list[str] = []

    def long(message: Any, job: pubsub_worker.Job) -> None:
        job.step("quick", lambda: done.append("quick"))

        def forever() -> None:
            while True:  # reports progress, never finishes: the cap stops it
                time.sleep(0.2)
                job.heartbeat()

        job.step("forever", forever)

    app = endpoints(long)  # lease 10 s: a request may run 8 s
    started = time.monotonic()
    answer = post(app, envelope(push_subscription, "1", op="k"))[0]
    took = time.monotonic() - started
    assert (answer.status_code, answer.json()["outcome"]) == (500, "retry")
    assert "ProcessingTimeout" in answer.json()["why"]
    assert took < 10  # answered before Pub/Sub's deadline
    doc = job_document(
        firestore_client,
        app.deliveries.settings.collection,
        push_subscription.subscription_path,
        "k",
    )
    assert doc["status"] == "released"
    assert doc["attempts"] == 1
    assert set(doc["steps"]) == {"quick"}  # the recorded step is kept for the retry


def test_a_permanent_error_reaches_the_failure_topic_once(
    endpoints: Any,
    push_subscription: SubscriptionHandle,
    make_subscription: Any,
    subscriber: Any,
    firestore_client: Any,
) -> None:
    failures: SubscriptionHandle = make_subscription(exactly_once=False)

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        raise pubsub_worker.PermanentError("not an order")

    app = endpoints(handle, failure_topic=failures.topic_path)
    first = post(app, envelope(push_subscription, "1", b"junk", op="k"))[0]
    again = post(app, envelope(push_subscription, "1", b"junk", op="k"))[0]
    assert (first.status_code, first.json()["outcome"]) == (200, "review")
    assert (again.status_code, again.json()["outcome"]) == (200, "ack")
    deadline = time.monotonic() + 5
    received: list[Any] = []
    while time.monotonic() < deadline:
        received += pull_now(subscriber, failures.subscription_path)
        time.sleep(0.25)
    assert len(received) == 1
    message = received[0].message
    assert message.data == b"junk"
    assert message.attributes["pubsub_worker_reason"] == "permanent"
    assert message.attributes["pubsub_worker_key"] == "k"
    doc = job_document(
        firestore_client,
        app.deliveries.settings.collection,
        push_subscription.subscription_path,
        "k",
    )
    assert doc["status"] == "failed"


def test_forged_expired_and_wrong_audience_tokens_are_refused_before_anything_is_written(
    emulators: Emulators,
    push_subscription: SubscriptionHandle,
    firestore_collection: str,
    firestore_client: Any,
) -> None:
    keys = TestKeys()
    check, certs = verifier(keys)
    runs: list[str] = []
    settings = pubsub_worker.Settings(
        subscription=push_subscription.subscription_path,
        collection=firestore_collection,
        key_attribute="op",
        lease_seconds=10,
        push_audience=AUDIENCE,
        push_service_account=SERVICE_ACCOUNT,
    )
    app = create_app(
        lambda message, job: runs.append(job.key),
        settings=settings,
        firestore_client=firestore_client,
        verifier=check,
    )
    app.start()
    old = int(time.time()) - 7200
    refused = {
        "none": None,
        "forged": TestKeys(kid=keys.kid).token(),
        "expired": keys.token(iat=old, exp=old + 3600),
        "wrong audience": keys.token(aud="https://elsewhere.example/"),
        "wrong account": keys.token(email="intruder@example.com"),
    }

    async def go() -> dict[str, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
            found = {}
            for name, token in refused.items():
                headers = {} if token is None else {"authorization": f"Bearer {token}"}
                body = envelope(push_subscription, "1", op=name.replace(" ", "-"))
                found[name] = (await client.post("/", json=body, headers=headers)).status_code
            good = {"authorization": f"Bearer {keys.token()}"}
            body = envelope(push_subscription, "2", op="good")
            found["valid"] = (await client.post("/", json=body, headers=good)).status_code
            return found

    try:
        answers = asyncio.run(go())
    finally:
        app.close()
    assert answers == {
        "none": 401,
        "forged": 401,
        "expired": 401,
        "wrong audience": 401,
        "wrong account": 403,
        "valid": 200,
    }
    assert runs == ["good"]
    stored = [
        doc.to_dict()["key"] for doc in firestore_client.collection(firestore_collection).stream()
    ]
    assert stored == ["good"]  # the refused requests wrote nothing
    assert certs.requests == 1  # the certificates were fetched once, then kept


def test_config_findings_read_a_push_subscription_from_the_emulator(
    emulators: Emulators, make_subscription: Any, subscriber: Any
) -> None:
    handle: SubscriptionHandle = make_subscription(
        exactly_once=False,
        ack_deadline_seconds=30,
        push=PushSpec("http://127.0.0.1:9/", no_wrapper=True, write_metadata=False),
    )
    settings = pubsub_worker.Settings(
        subscription=handle.subscription_path,
        key_attribute="orderId",
        lease_seconds=30,
        push_verify_token=False,
        pubsub_emulator_host=emulators.pubsub_host,
        firestore_emulator_host=emulators.firestore_host,
    )
    read = clients.read_subscription(subscriber, settings)
    assert is_push(read)
    found = {f.name: f.level for f in push_findings(settings, read)}
    assert found == {
        "subscription": "ok",
        "payload": "problem",  # unwrapped without metadata: no message id would arrive
        "key attribute": "problem",  # nor any attribute, so no key
        "exactly-once delivery": "ok",
        "ack deadline": "ok",
        "authentication": "ok",
        "retry policy": "hint",
        "dead-letter policy": "hint",
    }
    spec = PushSpec("http://127.0.0.1:9/", no_wrapper=True, write_metadata=True)
    set_push(subscriber, handle.subscription_path, spec)
    read = clients.read_subscription(subscriber, settings)  # with write-metadata now
    found = {f.name: f.level for f in push_findings(settings, read)}
    assert (found["payload"], found["key attribute"]) == ("ok", "warning")  # arrives as orderid
