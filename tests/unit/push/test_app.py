"""The push endpoint on the in-memory store: routes, probes, refusals and answers."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import httpx
import pytest

import pubsub_worker
from pubsub_worker.push import PushApp, create_app
from pubsub_worker.push.envelope import MAX_BODY_BYTES
from pubsub_worker.stores.base import Status
from tests.support.job_documents import put_job
from tests.support.world import SUB, FakePublisher, FlakyStore

from .tokens import TestKeys, verifier

KEYS = TestKeys()


def envelope(message_id: str, data: bytes = b"payload", **attributes: str) -> dict[str, Any]:
    return {
        "message": {
            "data": base64.b64encode(data).decode(),
            "attributes": attributes,
            "messageId": message_id,
            "publishTime": "2026-12-01T09:35:32.123Z",
        },
        "subscription": SUB,
    }


class Endpoint:
    """A push app on a fresh memory store, and a client for it."""

    def __init__(self, handler: Any, *, verify: bool = False, **settings: Any) -> None:
        self.store = FlakyStore()
        options: dict[str, Any] = {
            "subscription": SUB,
            "key_attribute": "op",
            "lease_seconds": 10,
            "max_attempts": 3,
            **settings,
        }
        self.check, self.certs = verifier(KEYS)
        self.app: PushApp = create_app(
            handler,
            settings=pubsub_worker.Settings(**options),
            store=self.store,
            publisher=FakePublisher(),
            verifier=self.check if verify else None,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(go())

    def push(self, body: Any, **kwargs: Any) -> httpx.Response:
        return self.call("POST", "/", json=body, **kwargs)


@pytest.fixture
def endpoints() -> Iterator[Any]:
    made: list[Endpoint] = []

    def make(handler: Any, **options: Any) -> Endpoint:
        made.append(Endpoint(handler, **options))
        return made[-1]

    yield make
    for endpoint in made:
        endpoint.app.close()


def test_a_job_completes_once_and_its_duplicate_is_answered_from_the_record(endpoints: Any) -> None:
    runs: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: runs.append(job.key))

    endpoint = endpoints(handle)
    first = endpoint.push(envelope("1", op="k"))
    assert (first.status_code, first.json()["outcome"]) == (200, "complete")
    again = endpoint.push(envelope("2", op="k"))  # another message, the same key
    assert (again.status_code, again.json()) == (
        200,
        {"outcome": "ack", "why": "job already completed"},
    )
    assert runs == ["k"]


def test_a_failed_attempt_is_500_and_the_retry_resumes(endpoints: Any) -> None:
    runs: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: runs.append("a"))
        if job.attempt == 1:
            raise RuntimeError("the sink is down")
        job.step("b", lambda: runs.append("b"))

    endpoint = endpoints(handle)
    failed = endpoint.push(envelope("1", op="k"))
    assert (failed.status_code, failed.json()["outcome"]) == (500, "retry")
    assert "the sink is down" in failed.json()["why"]
    done = endpoint.push(envelope("1", op="k"))
    assert (done.status_code, done.json()["outcome"]) == (200, "complete")
    assert runs == ["a", "b"]  # step a was not run again


def test_a_permanent_error_is_recorded_failed_then_200(endpoints: Any) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        raise pubsub_worker.PermanentError("not an order")

    endpoint = endpoints(handle)
    answer = endpoint.push(envelope("1", op="k"))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "review")
    again = endpoint.push(envelope("1", op="k"))
    assert (again.status_code, again.json()["outcome"]) == (200, "ack")


def test_a_missing_key_attribute_goes_to_review_as_in_the_pull_worker(endpoints: Any) -> None:
    endpoint = endpoints(lambda message, job: None)
    answer = endpoint.push(envelope("1"))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "review")
    assert "key attribute 'op' is missing" in answer.json()["why"]


def test_an_existing_callback_acks_and_nacks_through_the_job(endpoints: Any) -> None:
    def callback(message: Any) -> None:
        if message.data == b"bad":
            message.nack()
        else:
            message.job.step("a", lambda: "done")
            message.ack()

    endpoint = endpoints(callback)
    assert endpoint.push(envelope("1", b"good", op="k1")).json()["outcome"] == "complete"
    nacked = endpoint.push(envelope("2", b"bad", op="k2"))
    assert (nacked.status_code, nacked.json()["outcome"]) == (500, "retry")


def test_an_async_handler(endpoints: Any) -> None:
    async def handle(message: Any, job: pubsub_worker.AsyncJob) -> None:
        await job.step("a", lambda: "done")

    endpoint = endpoints(handle)
    answer = endpoint.push(envelope("1", op="k"))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "complete")


def test_malformed_requests_are_400_and_nothing_is_written(endpoints: Any) -> None:
    runs: list[str] = []
    endpoint = endpoints(lambda message, job: runs.append("ran"))
    for body in (b"", b"{", b"[]", json.dumps({"message": {"data": "aGk="}}).encode()):
        answer = endpoint.call("POST", "/", content=body)
        assert answer.status_code == 400
        assert answer.json()["outcome"] == "malformed"
        assert answer.json()["why"]
    assert runs == []
    assert endpoint.store.writes == 0


def test_a_request_for_another_subscription_is_400(endpoints: Any) -> None:
    endpoint = endpoints(lambda message, job: None)
    other = {**envelope("1", op="k"), "subscription": "projects/p/subscriptions/other"}
    answer = endpoint.push(other)
    assert answer.status_code == 400
    assert "records its jobs under projects/p/subscriptions/jobs" in answer.json()["why"]
    assert endpoint.store.writes == 0


def test_a_body_over_the_limit_is_413(endpoints: Any) -> None:
    endpoint = endpoints(lambda message, job: None)
    answer = endpoint.call("POST", "/", content=b"x" * (MAX_BODY_BYTES + 1))
    assert answer.status_code == 413
    assert endpoint.store.writes == 0


def test_routes_and_methods(endpoints: Any) -> None:
    endpoint = endpoints(lambda message, job: None)
    assert endpoint.call("GET", "/").status_code == 405
    assert endpoint.call("POST", "/livez").status_code == 405
    assert endpoint.call("GET", "/nowhere").status_code == 404
    assert endpoint.call("GET", "/livez").status_code == 200


def test_readiness_follows_start_and_drain(endpoints: Any) -> None:
    endpoint = endpoints(lambda message, job: None)
    assert endpoint.call("GET", "/readyz").text == "ok\n"  # a probe starts it
    endpoint.app.deliveries.engine.drain()
    ready = endpoint.call("GET", "/readyz")
    assert (ready.status_code, ready.text) == (503, "stopping: no new jobs are taken\n")
    answer = endpoint.push(envelope("1", op="k"))  # draining: not claimed, Pub/Sub retries
    assert (answer.status_code, answer.json()["outcome"]) == (503, "nack")
    assert endpoint.store.writes == 0
    endpoint.app.close()
    assert endpoint.call("GET", "/livez").status_code == 503


def test_an_endpoint_that_cannot_start_answers_503_with_why() -> None:
    # No failure topic client: the publisher cannot check the topic, so start-up fails.
    app = create_app(
        lambda message, job: None,
        settings=pubsub_worker.Settings(
            subscription=SUB, failure_topic="projects/p/topics/failures"
        ),
        store=FlakyStore(),
        publisher=FakePublisher(),
        verifier=None,
    )

    async def go() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://push") as client:
            return await client.get("/readyz"), await client.post("/", json=envelope("1"))

    ready, pushed = asyncio.run(go())
    assert ready.status_code == 503
    assert pushed.status_code == 503
    assert "cannot start" in pushed.json()["why"]
    assert "get_topic" in pushed.json()["why"]  # the failure topic's check, not the token's
    app.close()


def test_mounted_under_a_prefix_routes_are_relative() -> None:
    endpoint = Endpoint(lambda message, job: None)
    sent: list[MutableMapping[str, Any]] = []

    async def send(event: MutableMapping[str, Any]) -> None:
        sent.append(event)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/pubsub/readyz", "root_path": "/pubsub"}
    asyncio.run(endpoint.app(scope, receive, send))
    assert sent[0]["status"] == 200
    endpoint.app.close()


# -- the token, checked first ------------------------------------------------------------


def raw_push(endpoint: Endpoint, authorization: str | None) -> tuple[int, bool]:
    """POST through the raw ASGI interface: the status, and whether the body was read."""
    read = threading.Event()
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        read.set()
        return {"type": "http.request", "body": json.dumps(envelope("1", op="k")).encode()}

    async def send(event: MutableMapping[str, Any]) -> None:
        sent.append(event)

    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(endpoint.app(scope, receive, send))
    return sent[0]["status"], read.is_set()


@pytest.mark.parametrize(
    ("make_header", "status"),
    [
        (lambda: None, 401),
        (lambda: "Bearer " + TestKeys(kid=KEYS.kid).token(), 401),  # forged
        (lambda: "Bearer " + KEYS.token(exp=1, iat=0), 401),  # expired
        (lambda: "Bearer " + KEYS.token(aud="https://other.example/"), 401),
        (lambda: "Bearer " + KEYS.token(email="intruder@example.com"), 403),
    ],
    ids=["missing", "forged", "expired", "wrong-audience", "wrong-account"],
)
def test_a_bad_token_is_refused_before_the_body_is_read_or_anything_written(
    endpoints: Any, make_header: Any, status: int
) -> None:
    runs: list[str] = []
    endpoint = endpoints(lambda message, job: runs.append("ran"), verify=True)
    assert raw_push(endpoint, make_header()) == (status, False)
    assert runs == []
    assert endpoint.store.writes == 0


def test_a_valid_token_gets_the_request_delivered(endpoints: Any) -> None:
    runs: list[str] = []
    endpoint = endpoints(lambda message, job: runs.append("ran"), verify=True)
    assert raw_push(endpoint, "Bearer " + KEYS.token()) == (200, True)
    assert runs == ["ran"]


def test_the_endpoint_keeps_no_ordering_memory_of_its_own(endpoints: Any) -> None:
    """Pub/Sub pushes the next message of an ordering key only once the previous one was
    answered 2xx: a message of the key after a deferred one runs at once (a pull worker
    would hold it back behind the deferred one, which the client handed out early)."""
    ran: list[str] = []
    endpoint = endpoints(lambda message, job: ran.append(job.key))
    put_job(endpoint.store, SUB, "k1", Status.RUNNING, owner="another/1/x")  # a live lease
    first = envelope("1", op="k1")
    first["message"]["orderingKey"] = "customer-7"
    busy = endpoint.push(first)
    assert (busy.status_code, busy.json()["outcome"]) == (503, "defer")
    second = envelope("2", op="k2")
    second["message"]["orderingKey"] = "customer-7"
    done = endpoint.push(second)
    assert (done.status_code, done.json()["outcome"]) == (200, "complete")
    assert ran == ["k2"]
