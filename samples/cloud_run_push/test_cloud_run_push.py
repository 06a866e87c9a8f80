"""The push sample against the real emulators: the pull sample's handler behind a push endpoint.

The Pub/Sub emulator pushes real requests (it sends no token, so token
verification is off here: ``PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false``) to the
sample served two ways: ``pubsub-worker push`` as Cloud Run runs the image
(``K_SERVICE`` set: a 5 s grace), and the ASGI app of ``app.py`` under plain
uvicorn. Each order is charged once and its receipt published once, a
duplicate is answered from the record, a malformed order goes to the
failure path, and a SIGTERM mid-charge releases the order within Cloud
Run's 10 s window.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from emulator.bootstrap import set_push
from emulator.topology import PushSpec
from tests.support.observe import job_document, pull_now

pytestmark = pytest.mark.emulator

ROOT = Path(__file__).resolve().parents[2]
SIGTERM_WINDOW_S = 10.0


def order(order_id: str, cents: int) -> bytes:
    return json.dumps({"order_id": order_id, "amount_cents": cents}).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def status_of(firestore_client: Any, collection: str, subscription: str, key: str) -> str | None:
    try:
        return str(job_document(firestore_client, collection, subscription, key)["status"])
    except AssertionError:
        return None


@pytest.fixture
def push_subscription(make_subscription: Any) -> SubscriptionHandle:
    handle: SubscriptionHandle = make_subscription(
        exactly_once=False, ack_deadline_seconds=30, push=PushSpec("http://127.0.0.1:9/")
    )
    return handle


@pytest.fixture
def receipts(make_subscription: Any) -> SubscriptionHandle:
    handle: SubscriptionHandle = make_subscription(exactly_once=False)
    return handle


@pytest.fixture
def failures(make_subscription: Any) -> SubscriptionHandle:
    handle: SubscriptionHandle = make_subscription(exactly_once=False)
    return handle


@pytest.fixture
def sample_env(
    emulators: Emulators,
    push_subscription: SubscriptionHandle,
    firestore_collection: str,
    receipts: SubscriptionHandle,
    failures: SubscriptionHandle,
) -> dict[str, str]:
    """The service's environment on Cloud Run, pointed at the emulators."""
    return {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": push_subscription.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "order_id",
        "PUBSUB_WORKER_LEASE_SECONDS": "30",
        "PUBSUB_WORKER_FAILURE_TOPIC": failures.topic_path,
        "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false",
        "RECEIPTS_TOPIC": receipts.topic_path,
        "K_SERVICE": "orders-push",
    }


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], Path]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = tmp_path / f"server-{len(started)}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *command],
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(process)
        return process, log_path

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_orders_are_charged_once_through_pubsub_worker_push(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    push_subscription: SubscriptionHandle,
    receipts: SubscriptionHandle,
    failures: SubscriptionHandle,
    sample_env: dict[str, str],
    serve: Any,
) -> None:
    port = free_port()
    command = ["pubsub_worker.cli", "push", "samples.cloud_run.handler:handle"]
    server, log_path = serve([*command, "--host", "127.0.0.1", "--port", str(port)], sample_env)
    wait_for(lambda: "serving push requests" in log_path.read_text(), what="the endpoint")
    sub = push_subscription.subscription_path
    set_push(subscriber, sub, PushSpec(f"http://127.0.0.1:{port}/"))
    topic = push_subscription.topic_path
    publisher.publish(topic, order("o-1", 1250), order_id="o-1").result()
    publisher.publish(topic, order("o-1", 1250), order_id="o-1").result()  # a duplicate
    publisher.publish(topic, order("o-2", 990), order_id="o-2").result()
    publisher.publish(topic, b"not json", order_id="o-3").result()
    for key, wanted in (("o-1", "completed"), ("o-2", "completed"), ("o-3", "failed")):

        def reached(key: str = key, wanted: str = wanted) -> bool:
            return status_of(firestore_client, firestore_collection, sub, key) == wanted

        wait_for(reached, what=f"{key} {wanted}")
    wait_for(lambda: "acked without running" in log_path.read_text(), what="the duplicate")
    server.terminate()
    assert server.wait(timeout=SIGTERM_WINDOW_S) == 0
    log = log_path.read_text()
    assert "on Cloud Run (K_SERVICE is set): shutdown grace 5 s" in log
    assert log.count("charged order o-1: 1250 cents") == 1
    assert log.count("charged order o-2: 990 cents") == 1
    sent = sorted(
        json.loads(m.message.data)["order_id"]
        for m in pull_now(subscriber, receipts.subscription_path)
    )
    assert sent == ["o-1", "o-2"]
    failed = pull_now(subscriber, failures.subscription_path)
    assert [m.message.attributes["pubsub_worker_key"] for m in failed] == ["o-3"]


def test_a_sigterm_mid_charge_releases_the_order_inside_cloud_runs_window(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    push_subscription: SubscriptionHandle,
    receipts: SubscriptionHandle,
    sample_env: dict[str, str],
    serve: Any,
) -> None:
    port = free_port()
    sub = push_subscription.subscription_path
    command = ["pubsub_worker.cli", "push", "samples.cloud_run.handler:handle"]
    args = [*command, "--host", "127.0.0.1", "--port", str(port)]
    first, log_path = serve(args, {**sample_env, "ORDER_CHARGE_SECONDS": "60"})
    wait_for(lambda: "serving push requests" in log_path.read_text(), what="the endpoint")
    set_push(subscriber, sub, PushSpec(f"http://127.0.0.1:{port}/"))
    publisher.publish(push_subscription.topic_path, order("o-1", 1250), order_id="o-1").result()
    wait_for(
        lambda: status_of(firestore_client, firestore_collection, sub, "o-1") == "running",
        what="the charge to start",
    )
    started = time.monotonic()
    first.terminate()
    assert first.wait(timeout=SIGTERM_WINDOW_S + 5) == 0
    elapsed = time.monotonic() - started
    assert elapsed < SIGTERM_WINDOW_S - 2, f"stopped after {elapsed:.1f} s"
    assert status_of(firestore_client, firestore_collection, sub, "o-1") == "released"
    second, second_log = serve(args, {**sample_env, "ORDER_CHARGE_SECONDS": "0"})
    wait_for(
        lambda: status_of(firestore_client, firestore_collection, sub, "o-1") == "completed",
        timeout_s=90,
        what="the order retried by Pub/Sub",
    )
    second.terminate()
    assert second.wait(timeout=SIGTERM_WINDOW_S) == 0
    assert "charged order" not in log_path.read_text()
    assert second_log.read_text().count("charged order o-1: 1250 cents") == 1
    doc = job_document(firestore_client, firestore_collection, sub, "o-1")
    assert (doc["epoch"], doc["attempts"]) == (2, 1)  # a stop gives its attempt back
    receipts_sent = pull_now(subscriber, receipts.subscription_path)
    assert [json.loads(m.message.data)["order_id"] for m in receipts_sent] == ["o-1"]


def test_the_asgi_app_under_plain_uvicorn(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    push_subscription: SubscriptionHandle,
    sample_env: dict[str, str],
    serve: Any,
) -> None:
    port = free_port()
    command = ["uvicorn", "samples.cloud_run_push.app:app", "--port", str(port)]
    server, log_path = serve(command, sample_env)
    wait_for(lambda: "Application startup complete" in log_path.read_text(), what="uvicorn")
    sub = push_subscription.subscription_path
    set_push(subscriber, sub, PushSpec(f"http://127.0.0.1:{port}/"))
    publisher.publish(push_subscription.topic_path, order("o-9", 500), order_id="o-9").result()
    wait_for(
        lambda: status_of(firestore_client, firestore_collection, sub, "o-9") == "completed",
        what="the order",
    )
    server.terminate()
    assert server.wait(timeout=SIGTERM_WINDOW_S) in (0, -15)  # uvicorn re-raises the signal
    assert "Application shutdown complete" in log_path.read_text()
