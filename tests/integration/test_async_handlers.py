"""``async def`` handlers in a real worker: many jobs awaiting slow I/O at once, on one loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from google.cloud import firestore

import pubsub_worker
from emulator import Emulators, SubscriptionHandle, unique_id
from pubsub_worker import Counter
from pubsub_worker._job.async_job import AsyncJob
from pubsub_worker._job.keys import document_id
from pubsub_worker.stores.firestore_async import async_twin

JOBS = 40
SLOW_S = 1.0


class SlowServer:
    """A local HTTP server whose every answer takes ``SLOW_S``; counts requests in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards in_flight, most, served
        self.in_flight = 0
        self.most = 0
        self.served = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer.lock:
                    outer.in_flight += 1
                    outer.most = max(outer.most, outer.in_flight)
                threading.Event().wait(SLOW_S)
                body = self.path.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with outer.lock:
                    outer.in_flight -= 1
                    outer.served += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    server = SlowServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


async def http_get(port: int, path: str) -> str:
    """A minimal HTTP/1.0 GET with asyncio streams (no client library needed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    return response.split(b"\r\n\r\n", 1)[1].decode()


def test_many_async_jobs_await_a_slow_call_at_once(
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    slow_server: SlowServer,
) -> None:
    """40 jobs, each awaiting a 1 s HTTP call in a step, with 40 messages in flight.

    They wait for the server together on the worker's one event loop (the
    server sees many requests at once), and each job's step runs exactly once.
    """
    settings = settings_for(eod_subscription, key_attribute="op", max_messages=JOBS)
    calls: list[str] = []

    async def handle(message: Any, job: AsyncJob) -> None:
        async def fetch() -> str:
            calls.append(job.key)
            return await http_get(slow_server.port, f"/{job.key}")

        body = await job.step("fetch", fetch)
        assert body == f"/{job.key}"
        await job.step("done", lambda: len(body))

    with worker(handle, settings) as w:
        for n in range(JOBS):
            publisher.publish(eod_subscription.topic_path, b"x", op=f"job-{n}")
        w.wait_for(lambda: w.counter(Counter.COMPLETED) == JOBS, timeout_s=60)

    assert sorted(calls) == sorted(f"job-{n}" for n in range(JOBS))
    assert slow_server.served == JOBS
    assert slow_server.most >= JOBS // 2  # concurrent on one loop, not one at a time


def test_an_async_transactional_step_commits_in_the_stores_named_database(
    emulators: Emulators,
    publisher: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
) -> None:
    """The async transaction reads and writes the database the store's client names."""
    database = unique_id("db")
    named: Any = firestore.Client(project=emulators.project, database=database)
    settings = settings_for(eod_subscription, key_attribute="op")
    sink = unique_id("sink")
    async_clients: list[firestore.AsyncClient] = []

    async def handle(message: Any, job: AsyncJob) -> None:
        if not async_clients:  # made on the worker's loop, like the handler's own I/O
            async_clients.append(
                firestore.AsyncClient(project=emulators.project, database=database)
            )

        async def write(transaction: Any) -> str:
            transaction.set(async_clients[0].collection(sink).document(job.key), {"n": 1})
            return "written"

        assert await job.transactional_step("write", write) == "written"

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, firestore_client=named)
    try:
        with worker(wrapped, settings) as w:
            publisher.publish(eod_subscription.topic_path, b"x", op="op-1").result()
            w.wait_for(lambda: w.counter(Counter.COMPLETED) + w.counter(Counter.LOST_OWNERSHIP) > 0)
            outcome = (w.counter(Counter.COMPLETED), w.counter(Counter.LOST_OWNERSHIP))

        assert outcome == (1, 0)
        doc_id = document_id(settings.subscription_path, "op-1")
        job = named.collection(settings.collection).document(doc_id).get().to_dict()
        assert (job["status"], job["epoch"], job["steps"]["write"]["epoch"]) == ("completed", 1, 1)
        assert named.collection(sink).document("op-1").get().to_dict() == {"n": 1}
        # Nothing went to the default database.
        assert not firestore_client.collection(settings.collection).document(doc_id).get().exists
        assert not firestore_client.collection(sink).document("op-1").get().exists
    finally:
        named.close()


def test_the_async_twin_of_a_client_targets_its_server_database_and_credentials(
    emulators: Emulators, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made from the sync client, not from the environment (which may have changed since)."""
    options = {"api_endpoint": "firestore.example.test:443"}
    sync: Any = firestore.Client(project="p-twin", database="orders", client_options=options)
    monkeypatch.delenv("FIRESTORE_EMULATOR_HOST", raising=False)

    twin: Any = async_twin(sync)

    assert (twin.project, twin._database_string) == ("p-twin", "projects/p-twin/databases/orders")
    assert twin._target == sync._target == emulators.env()["FIRESTORE_EMULATOR_HOST"]
    assert twin._credentials is sync._credentials
    assert twin._client_options is sync._client_options
