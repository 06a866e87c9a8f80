"""The push door under real uvicorn: what reaches ``pubsub-worker push`` and what it runs.

Each test starts the real command (``python -m pubsub_worker.cli push``, uvicorn, the
Firestore emulator) and sends it requests itself, over HTTP or a raw socket, so that a
request can be duplicated, cut short or sent while every thread is busy on purpose. The
handler is ``tests.support.worker``'s three steps ``a``, ``b``, ``c`` (one effect line
each), held inside step ``a`` by a gate where a test needs a request in flight.
"""

from __future__ import annotations

import base64
import hashlib
import signal
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from emulator import SubscriptionHandle
from tests.support.gate import Gate
from tests.support.observe import job_document, runs
from tests.support.processes import Effects

from .test_push_server import (  # the fixtures of the push end-to-end tests
    effects,
    free_port,
    push_subscription,
    server_env,
    servers,
    status,
    wait_for,
)

__all__ = ["effects", "push_subscription", "server_env", "servers"]

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]


def envelope(sub: str, message_id: str, key: str, data: bytes = b"order") -> dict[str, Any]:
    return {
        "message": {
            "data": base64.b64encode(data).decode(),
            "attributes": {"op": key},
            "messageId": message_id,
            "publishTime": "2026-12-02T10:00:00.000Z",
        },
        "subscription": sub,
    }


def post(port: int, body: dict[str, Any], timeout_s: float = 60) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/", json=body, timeout=timeout_s)


class Request(threading.Thread):
    """A request sent from a thread of its own; :attr:`response` once answered."""

    def __init__(self, port: int, body: dict[str, Any], timeout_s: float = 60) -> None:
        super().__init__(daemon=True)
        self.port, self.body, self.timeout_s = port, body, timeout_s
        self.response: httpx.Response | None = None
        self.error: httpx.HTTPError | None = None
        self.start()

    def run(self) -> None:
        try:
            self.response = post(self.port, self.body, self.timeout_s)
        except httpx.HTTPError as exc:  # the server went away: no answer
            self.error = exc

    def answer(self, timeout_s: float = 60) -> httpx.Response:
        self.join(timeout_s)
        assert self.response is not None, "no answer"
        return self.response


def test_a_decorated_handler_is_served_as_run_serves_it(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
    effects: Effects,
    servers: Any,
) -> None:
    """``@exactly_once`` as the README teaches it: the push endpoint takes the same handler."""
    port = free_port()
    servers(server_env, port, handler="tests.support.worker:decorated_steps")
    sub = push_subscription.subscription_path
    answer = post(port, envelope(sub, "m-decorated", "k"))
    assert (answer.status_code, answer.json()["outcome"]) == (200, "complete")
    assert [len(runs(effects, step, "k")) for step in "abc"] == [1, 1, 1]
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert (doc["status"], doc["attempts"]) == ("completed", 1)


def test_a_request_cut_mid_body_runs_nothing_and_the_whole_one_then_runs(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
    effects: Effects,
    servers: Any,
) -> None:
    """Unwrapped form: the body is the data. A client that disconnects mid-body leaves no
    delivery behind; Pub/Sub's retry with the whole body runs the job on the whole data."""
    port = free_port()
    server = servers(server_env, port)
    sub = push_subscription.subscription_path
    data = b"x" * 4000
    head = (
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {len(data)}\r\nx-goog-pubsub-message-id: m-cut\r\n"
        f"x-goog-pubsub-subscription-name: {sub}\r\n"
        "x-goog-pubsub-publish-time: 2026-12-02T10:00:00.000Z\r\nop: k-cut\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + data[:1500])
        time.sleep(0.5)
    wait_for(lambda: "cut short" in server.log(), 10, "the cut request logged")
    time.sleep(1)  # anything it would run would show below
    assert effects.count() == 0
    assert status(firestore_client, firestore_collection, sub, "k-cut") is None
    whole = httpx.post(
        f"http://127.0.0.1:{port}/",
        content=data,
        headers={
            "content-type": "application/octet-stream",
            "x-goog-pubsub-message-id": "m-cut",
            "x-goog-pubsub-subscription-name": sub,
            "x-goog-pubsub-publish-time": "2026-12-02T10:00:00.000Z",
            "op": "k-cut",
        },
        timeout=60,
    )
    assert (whole.status_code, whole.json()["outcome"]) == (200, "complete")
    doc = job_document(firestore_client, firestore_collection, sub, "k-cut")
    assert doc["status"] == "completed"
    assert doc["payload_sha256"] == hashlib.sha256(data).hexdigest()
    assert [len(runs(effects, step, "k-cut")) for step in "abc"] == [1, 1, 1]


def test_a_duplicate_on_the_same_instance_adopts_the_running_request(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
    effects: Effects,
    servers: Any,
) -> None:
    """The second request for a message still running here waits for it and is answered from
    the record: it claims nothing and runs nothing; the first, whose message the second
    settles, is not the one that acks."""
    port = free_port()
    server_env = {**server_env, "CHAOS_GATES": "step:a"}
    servers(server_env, port)
    sub = push_subscription.subscription_path
    body = envelope(sub, "m-dup", "k")
    first = Request(port, body)
    held = Gate(effects.path, "step:a")
    held.wait_arrived()
    second = Request(port, body)
    time.sleep(1.5)
    assert second.response is None  # it waits for the running request
    held.release()
    assert second.answer().json()["outcome"] == "ack"  # answered from the completed record
    assert (first.answer().status_code, second.answer().status_code) == (409, 200)
    assert [len(runs(effects, step, "k")) for step in "abc"] == [1, 1, 1]
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)


def test_a_duplicate_waits_no_longer_than_its_time_left_and_writes_nothing(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
    effects: Effects,
    servers: Any,
) -> None:
    """With a 10 s deadline a request may run 8 s and needs 2 s of them to claim: a duplicate
    of a request held longer is answered 503 after about 6 s, without a claim, no attempt
    counted; the running request goes on undisturbed and completes the job once."""
    port = free_port()
    servers({**server_env, "CHAOS_GATES": "step:a"}, port)
    sub = push_subscription.subscription_path
    body = envelope(sub, "m-long", "k")
    first = Request(port, body)
    held = Gate(effects.path, "step:a")
    held.wait_arrived()
    second = post(port, body)
    assert (second.status_code, second.json()["outcome"]) == (503, "defer")
    assert "too little of its processing cap" in second.json()["why"]
    assert second.headers["retry-after"] == "10"
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("running", 1, 1)
    held.release()
    # The first request completes the job but does not ack: its message was handed to the
    # newer request (as a pulled message's older ack id is stale). Pub/Sub's retry of the
    # deferred one is answered from the record.
    assert first.answer().status_code == 409
    retry = post(port, body)
    assert (retry.status_code, retry.json()["outcome"]) == (200, "ack")
    assert [len(runs(effects, step, "k")) for step in "abc"] == [1, 1, 1]


def test_a_request_finding_every_thread_busy_is_answered_at_once_and_costs_no_attempt(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
    effects: Effects,
    servers: Any,
) -> None:
    """``MAX_MESSAGES=1`` and the one thread busy: another request is not queued (its cap
    would run out waiting, and a claim past it burns an attempt) but answered 503 now."""
    port = free_port()
    env = {
        **server_env,
        "CHAOS_GATES": "step:a",
        "PUBSUB_WORKER_MAX_MESSAGES": "1",
        "PUBSUB_WORKER_MAX_ATTEMPTS": "1",
    }
    servers(env, port)
    sub = push_subscription.subscription_path
    first = Request(port, envelope(sub, "m-1", "k1"))
    held = Gate(effects.path, "step:a")
    held.wait_arrived()
    busy = post(port, envelope(sub, "m-2", "k2"), timeout_s=5)
    assert (busy.status_code, busy.json()["outcome"]) == (503, "busy")
    assert "retry-after" in busy.headers
    assert status(firestore_client, firestore_collection, sub, "k2") is None  # nothing written
    held.release()
    assert first.answer().status_code == 200
    again = post(port, envelope(sub, "m-2", "k2"))  # Pub/Sub's retry
    assert (again.status_code, again.json()["outcome"]) == (200, "complete")
    doc = job_document(firestore_client, firestore_collection, sub, "k2")
    assert (doc["status"], doc["attempts"]) == ("completed", 1)


def test_a_shutdown_gives_one_grace_and_wakes_a_request_waiting_for_its_key(
    server_env: dict[str, str],
    push_subscription: SubscriptionHandle,
    effects: Effects,
    servers: Any,
) -> None:
    """SIGTERM: a request waiting for a busy key is answered at once (not claimed, Pub/Sub
    retries it), the running one gets the grace once (the server's signal and its lifespan
    do not give two), then it is stopped and the server exits."""
    port = free_port()
    env = {**server_env, "CHAOS_GATES": "step:a", "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "2"}
    server = servers(env, port)
    sub = push_subscription.subscription_path
    running = Request(port, envelope(sub, "m-run", "k"))
    held = Gate(effects.path, "step:a")
    held.wait_arrived()
    waiting = Request(port, envelope(sub, "m-other", "k"))  # another message of the same key
    time.sleep(1)
    server.process.send_signal(signal.SIGTERM)
    answer = waiting.answer(timeout_s=5)
    assert (answer.status_code, answer.json()["outcome"]) == (503, "nack")
    server.process.wait(timeout=60)
    held.release()
    log = server.log()
    assert log.count("shutdown grace over") == 1, log
    running.join(5)
    assert running.response is None or running.response.status_code != 200  # never acked
