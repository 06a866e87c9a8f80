"""The push endpoint served by uvicorn on loopback: what a sender sees over real HTTP.

Each test runs :func:`pubsub_worker.push.create_app` on the in-memory store
behind a real server (:class:`tests.support.push_server.PushServer`) and
sends it real requests: header names lower-cased by the HTTP stack, bodies
as raw bytes, answers as Pub/Sub reads them (the status).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import pubsub_worker
from pubsub_worker.push import TokenVerifier, create_app
from pubsub_worker.push.auth import CachedCertificates
from pubsub_worker.push.envelope import parse
from tests.support.push_server import PushServer
from tests.support.world import SUB, FakePublisher

from .tokens import AUDIENCE, SERVICE_ACCOUNT, CertServer, TestKeys

KEYS = TestKeys()


class Served:
    """A push app on a fresh memory store, served; ``runs`` lists the keys of jobs run."""

    def __init__(self, *, verifier: TokenVerifier | None = None, **settings: Any) -> None:
        self.store = pubsub_worker.MemoryJobStore()
        self.runs: list[str] = []
        values: dict[str, Any] = {"subscription": SUB, "lease_seconds": 10, **settings}
        self.app = create_app(
            lambda message, job: self.runs.append(job.key),
            settings=pubsub_worker.Settings(**values),
            store=self.store,
            publisher=FakePublisher(),
            verifier=verifier,
        )
        self.server = PushServer(self.app)

    def post(self, content: bytes, **headers: str) -> httpx.Response:
        return httpx.post(self.server.url, content=content, headers=headers, timeout=30)


@pytest.fixture
def served() -> Iterator[Any]:
    """``served(verifier=..., **settings)``: a started :class:`Served`, stopped after the test."""
    started: list[Served] = []

    def make(**options: Any) -> Served:
        endpoint = Served(**options)
        endpoint.server.start()
        started.append(endpoint)
        return endpoint

    yield make
    for endpoint in started:
        endpoint.server.stop()


def wrapped(message_id: str = "1001", **top: Any) -> dict[str, Any]:
    message = {
        "data": base64.b64encode(b"payload").decode(),
        "attributes": {"op": "k"},
        "messageId": message_id,
        "publishTime": "2026-12-01T09:35:32.123Z",
    }
    return {"message": message, "subscription": SUB, **top}


def test_a_delivery_attempt_of_1e400_is_answered_400_with_its_reason(served: Any) -> None:
    endpoint = served()
    raw = json.dumps(wrapped())[:-1].encode() + b', "deliveryAttempt": 1e400}'
    answer = endpoint.post(raw, **{"content-type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["outcome"] == "malformed"
    assert '"deliveryAttempt" is not a delivery count' in answer.json()["why"]
    assert endpoint.runs == []
    assert endpoint.store.writes == 0
    # The same server goes on: a sound request after it is delivered.
    good = endpoint.post(json.dumps(wrapped("1002")).encode())
    assert (good.status_code, endpoint.runs) == (200, ["1002"])


def test_unwrapped_delivery_attempt_headers_that_are_no_count_are_400(served: Any) -> None:
    endpoint = served()
    for value in ("1e400", "inf", "-1", "2147483648"):
        answer = endpoint.post(
            b"payload",
            **{"x-goog-pubsub-message-id": "1001", "x-goog-pubsub-delivery-attempt": value},
        )
        assert answer.status_code == 400, value
        assert "x-goog-pubsub-delivery-attempt" in answer.json()["why"]
    assert endpoint.runs == []


def test_an_upper_case_key_attribute_survives_the_lower_casing_of_header_names() -> None:
    # What parse() makes of an unwrapped request as a real server hands it over.
    seen: list[dict[str, str]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {
            bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in scope["headers"]
        }
        body = (await receive())["body"]
        seen.append(dict(parse(headers, body, key_attribute="orderId").attributes))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    headers = {"x-goog-pubsub-message-id": "1001", "orderId": "o-1", "tenantName": "acme"}
    with PushServer(app, lifespan="off") as server:
        assert httpx.post(server.url, content=b"payload", headers=headers).status_code == 204
    assert seen == [{"orderId": "o-1", "tenantname": "acme"}]


def test_an_unwrapped_request_is_keyed_by_an_upper_case_key_attribute(served: Any) -> None:
    endpoint = served(key_attribute="orderId")
    answer = endpoint.post(b"payload", **{"x-goog-pubsub-message-id": "1001", "orderId": "o-1"})
    assert (answer.status_code, answer.json()["outcome"]) == (200, "complete")
    assert endpoint.runs == ["o-1"]


def test_a_certificate_answer_that_is_not_certificates_is_503_and_not_remembered(
    served: Any,
) -> None:
    certs = CertServer(KEYS.certs())
    certs.answer = b"<html>Sign in to the network</html>"  # a day's max-age, if believed
    check = TokenVerifier(
        audience=AUDIENCE,
        service_account=SERVICE_ACCOUNT,
        certificates=CachedCertificates(certs),
    )
    endpoint = served(verifier=check)
    token = {"authorization": "Bearer " + KEYS.token()}
    body = json.dumps(wrapped()).encode()
    for _ in range(2):
        answer = endpoint.post(body, **token)
        assert answer.status_code == 503  # ours to fix: Pub/Sub retries; never the sender's 401
        assert "certificates" in answer.json()["why"]
    assert certs.requests == 2  # asked again each time: the bad answer was not kept
    certs.answer = None  # the URL answers certificates again
    assert endpoint.post(body, **token).status_code == 200
    assert endpoint.runs == ["1001"]
    assert (
        endpoint.post(body, **{"authorization": "Bearer " + KEYS.token(aud="x")}).status_code == 401
    )
