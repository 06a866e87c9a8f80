"""Push end to end: the Pub/Sub emulator POSTs real push requests to ``pubsub-worker push``.

Each test starts the real command (``python -m pubsub_worker.cli push
tests.support.worker:handle_steps``, steps ``a``, ``b``, ``c``, each
recording one effect line with its pid and epoch) on a free port, and a
push subscription of the emulator pointed at it (no exactly-once delivery,
which Pub/Sub has for pull only, and a 10 s ack deadline: the push request
timeout). The emulator sends no token, so the servers run with
``PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false``; the token check is tested in
process (``tests/unit/push``, ``tests/integration/test_push_app.py``).

Measured on the emulator: a request unanswered after the ack deadline is
sent again (10 s later, while the first is still open), a non-2xx answer is
retried within about a second, and a changed push endpoint takes the next
attempt.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from emulator.bootstrap import set_push
from emulator.topology import PushSpec
from tests.support.gate import Gate
from tests.support.observe import job_document, pull_now, runs, step_epochs
from tests.support.processes import ROOT, Effects, Worker, stop_all

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

HANDLER = "tests.support.worker:handle_steps"
DEADLINE_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def endpoint(port: int) -> PushSpec:
    return PushSpec(f"http://127.0.0.1:{port}/")


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.jsonl")


@pytest.fixture
def push_subscription(make_subscription: Any) -> SubscriptionHandle:
    """A push subscription to a closed port until a test points it at its server."""
    handle: SubscriptionHandle = make_subscription(
        exactly_once=False, ack_deadline_seconds=DEADLINE_S, push=endpoint(9)
    )
    return handle


@pytest.fixture
def server_env(
    emulators: Emulators,
    push_subscription: SubscriptionHandle,
    firestore_collection: str,
    effects: Effects,
) -> dict[str, str]:
    return {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": push_subscription.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "op",
        "PUBSUB_WORKER_LEASE_SECONDS": str(DEADLINE_S),
        "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "2",
        "PUBSUB_WORKER_LOG_FORMAT": "json",
        "CHAOS_EFFECTS": str(effects.path),
    }


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Any]:
    """``servers(env, port, name, handler)`` starts ``pubsub-worker push``; all are killed at
    the end."""
    started: list[Worker] = []

    def start(
        env: dict[str, str], port: int, name: str = "server", handler: str = HANDLER
    ) -> Worker:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pubsub_worker.cli",
                    "push",
                    handler,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = Worker(process, log_path)
        started.append(server)
        server.wait_for_log("serving push requests")
        return server

    yield start
    stop_all(started)


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def status(firestore_client: Any, collection: str, subscription: str, key: str) -> str | None:
    try:
        return str(job_document(firestore_client, collection, subscription, key)["status"])
    except AssertionError:
        return None


def test_duplicates_published_under_one_key_run_once(
    publisher: Any,
    subscriber: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    port = free_port()
    server = servers(server_env, port)
    set_push(subscriber, push_subscription.subscription_path, endpoint(port))
    keys = ["order-1"] * 5 + ["order-2", "order-3"]
    for key in keys:
        publisher.publish(push_subscription.topic_path, key.encode(), op=key).result()
    sub = push_subscription.subscription_path
    for key in set(keys):
        wait_for(
            lambda key=key: status(firestore_client, firestore_collection, sub, key) == "completed",
            60,
            f"{key} completed",
        )
    wait_for(lambda: server.log().count("acked without running") >= 4, 30, "4 duplicates acked")
    time.sleep(2)  # any late request would show below
    for key in set(keys):
        for step in ("a", "b", "c"):
            assert len(runs(effects, step, key)) == 1, (key, step, effects.read())
        doc = job_document(firestore_client, firestore_collection, sub, key)
        assert (doc["epoch"], doc["attempts"]) == (1, 1)
    log = server.log()
    assert log.count("completed (attempt 1, epoch 1)") == 3
    assert log.count("job already completed; acked without running") == 4


def test_a_server_killed_mid_step_resumes_after_the_last_recorded_step(
    publisher: Any,
    subscriber: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    # A 30 s deadline: the retry's request may poll the dead server's lease for 10 s and
    # still have its whole cap (24 s) to run; with 10 s it could claim past its cap of 8 s
    # and be released once more (correct, but another epoch).
    sub = push_subscription.subscription_path
    subscriber.update_subscription(
        request={
            "subscription": {"name": sub, "ack_deadline_seconds": 30},
            "update_mask": {"paths": ["ack_deadline_seconds"]},
        }
    )
    server_env = {**server_env, "PUBSUB_WORKER_LEASE_SECONDS": "30"}
    port = free_port()
    first = servers({**server_env, "CHAOS_KILL_AT": "step:b"}, port, "first")
    set_push(subscriber, sub, endpoint(port))
    publisher.publish(push_subscription.topic_path, b"order", op="k").result()
    effects.wait_until("killed", 1, timeout_s=60)
    first.process.wait(timeout=10)
    assert first.process.returncode == -9
    rescuer = servers(server_env, port, "rescuer")  # the retries find the same endpoint
    wait_for(
        lambda: status(firestore_client, firestore_collection, sub, "k") == "completed",
        90,
        "the job completed by the restarted server",
    )
    killed_pid = first.pid
    assert runs(effects, "a", "k") == [(killed_pid, 1)]  # recorded before the kill: not again
    assert [epoch for _, epoch in runs(effects, "b", "k")] == [2]
    assert [epoch for _, epoch in runs(effects, "c", "k")] == [2]
    assert {pid for pid, _ in runs(effects, "b", "k") + runs(effects, "c", "k")} == {rescuer.pid}
    assert effects.count("killed") == 1
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert step_epochs(doc) == {"a": 1, "b": 2, "c": 2}
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 2)


def test_two_servers_with_overlapping_deliveries_of_one_job_never_both_commit(
    publisher: Any,
    subscriber: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    port_a, port_b = free_port(), free_port()
    server_a = servers({**server_env, "CHAOS_GATES": "step:b"}, port_a, "a")
    server_b = servers(server_env, port_b, "b")
    gate = Gate(effects.path, "step:b")
    sub = push_subscription.subscription_path
    set_push(subscriber, sub, endpoint(port_a))
    publisher.publish(push_subscription.topic_path, b"order", op="k").result()
    assert gate.wait_arrived() == server_a.pid  # a recorded, A inside step b
    server_a.pause()  # frozen past its lease: its request times out, Pub/Sub sends it again
    set_push(subscriber, sub, endpoint(port_b))
    wait_for(
        lambda: status(firestore_client, firestore_collection, sub, "k") == "completed",
        90,
        "server B completed the job",
    )
    server_a.resume()
    gate.release()  # A finishes step b's function; its commit must be refused
    server_a.wait_for_log('"outcome"', "lost ownership", timeout_s=60)
    wait_for(lambda: len(runs(effects, "b", "k")) == 2, 30, "A's late run of step b")
    time.sleep(2)
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert (doc["status"], doc["epoch"]) == ("completed", 2)
    assert step_epochs(doc) == {"a": 1, "b": 2, "c": 2}  # every record from one owner per step
    assert runs(effects, "c", "k") == [(server_b.pid, 2)]  # A never went past b
    log_a, log_b = server_a.log(), server_b.log()
    assert "completed (attempt" not in log_a
    assert log_b.count("completed (attempt 2, epoch 2)") == 1


def test_a_permanent_error_reaches_the_failure_topic_once(
    publisher: Any,
    subscriber: Any,
    make_subscription: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    failures: SubscriptionHandle = make_subscription(exactly_once=False)
    port = free_port()
    env = {**server_env, "PUBSUB_WORKER_FAILURE_TOPIC": failures.topic_path}
    server = servers(env, port, "permanent", "tests.support.worker:handle_permanent")
    sub = push_subscription.subscription_path
    set_push(subscriber, sub, endpoint(port))
    publisher.publish(push_subscription.topic_path, b"junk", op="bad").result()
    wait_for(
        lambda: status(firestore_client, firestore_collection, sub, "bad") == "failed",
        60,
        "the job recorded as failed",
    )
    publisher.publish(push_subscription.topic_path, b"junk", op="bad").result()  # a copy
    wait_for(lambda: "acked without running" in server.log(), 30, "the copy acked")
    received: list[Any] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        received += pull_now(subscriber, failures.subscription_path)
        time.sleep(0.25)
    assert len(received) == 1
    assert received[0].message.data == b"junk"
    assert received[0].message.attributes["pubsub_worker_reason"] == "permanent"
    assert received[0].message.attributes["pubsub_worker_key"] == "bad"
    assert effects.count("attempt", "bad") == 1  # the handler ran once
    doc = job_document(firestore_client, firestore_collection, sub, "bad")
    assert (doc["attempts"], doc["reason"]) == (1, "permanent")


def test_sigterm_mid_step_releases_the_job_and_exits_0(
    publisher: Any,
    subscriber: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    port = free_port()
    env = {**server_env, "CHAOS_STEP_SLEEP_S": "30", "CHAOS_SLEEP_STEPS": "b"}
    env["CHAOS_HEARTBEAT"] = "1"  # progress while it sleeps: only the shutdown stops it
    server = servers(env, port, "stopped")
    sub = push_subscription.subscription_path
    set_push(subscriber, sub, endpoint(port))
    publisher.publish(push_subscription.topic_path, b"order", op="k").result()
    wait_for(lambda: len(runs(effects, "a", "k")) == 1, 30, "step a")
    time.sleep(0.5)  # inside step b
    started = time.monotonic()
    assert server.terminate(timeout_s=30) == 0
    assert time.monotonic() - started < 2 + 6  # the grace (2 s), then a boundary
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert doc["status"] == "released"
    assert doc["attempts"] == 0  # a shutdown gives the attempt back
    assert set(doc["steps"]) == {"a"}
    assert runs(effects, "b", "k") == []
    assert "the worker is shutting down" in server.log()
    rescuer = servers(server_env, port, "rescuer")  # Pub/Sub sends it again
    wait_for(
        lambda: status(firestore_client, firestore_collection, sub, "k") == "completed",
        60,
        "the job completed after the restart",
    )
    assert runs(effects, "a", "k") == [(server.pid, 1)]
    assert runs(effects, "b", "k") == [(rescuer.pid, 2)]


def test_the_unwrapped_form_with_metadata_headers_runs_the_same_job(
    publisher: Any,
    subscriber: Any,
    push_subscription: SubscriptionHandle,
    server_env: dict[str, str],
    firestore_collection: str,
    firestore_client: Any,
    effects: Effects,
    servers: Any,
) -> None:
    port = free_port()
    servers(server_env, port)
    sub = push_subscription.subscription_path
    unwrapped = PushSpec(f"http://127.0.0.1:{port}/", no_wrapper=True, write_metadata=True)
    set_push(subscriber, sub, unwrapped)
    publisher.publish(push_subscription.topic_path, b"order", op="k").result()
    publisher.publish(push_subscription.topic_path, b"order", op="k").result()
    wait_for(
        lambda: status(firestore_client, firestore_collection, sub, "k") == "completed",
        60,
        "the job completed",
    )
    time.sleep(2)
    assert [len(runs(effects, step, "k")) for step in "abc"] == [1, 1, 1]
    doc = job_document(firestore_client, firestore_collection, sub, "k")
    assert (doc["epoch"], doc["attempts"]) == (1, 1)
