"""The metrics and health endpoint of ``run()``, scraped over HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker._worker.serve import Health, MetricsServer
from tests.support.processes import ROOT

pytestmark = pytest.mark.emulator

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page by name (labels folded into the name)."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_run_serves_prometheus_metrics_and_probes_while_it_consumes(
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op", max_messages=4)
    release = threading.Event()

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: "a")
        if job.key == "slow":
            job.step("wait", lambda: release.wait(30))

    wrapped = pubsub_worker.exactly_once(handle, settings=settings)
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(
        target=pubsub_worker.run,
        kwargs={
            "handler": wrapped,
            "settings": settings,
            "stop": stop,
            "metrics_port": port,
            "metrics_host": HOST,
        },
        daemon=True,
    )
    thread.start()
    try:
        wait_for(lambda: _answers(port))
        wait_for(lambda: get(port, "/readyz") == (200, "ok\n"))
        assert get(port, "/livez") == (200, "ok\n")
        assert get(port, "/healthz") == (200, "ok\n")
        for n in range(3):
            publisher.publish(eod_subscription.topic_path, b"doc", op=f"k{n}").result()
        wait_for(lambda: wrapped.metrics.get(Counter.COMPLETED) == 3)
        publisher.publish(eod_subscription.topic_path, b"doc", op="slow").result()
        wait_for(lambda: wrapped.in_flight() == 1)

        status, text = get(port, "/metrics")

        assert status == 200
        values = samples(text)
        assert values["pubsub_worker_completed_total"] == 3
        assert values["pubsub_worker_received_total"] == 4
        assert values["pubsub_worker_steps_run_total"] == 4  # a x 4; the slow wait still runs
        assert values["pubsub_worker_in_flight"] == 1
        assert values["pubsub_worker_utilization"] == 0.25  # 1 of MAX_MESSAGES=4 slots
        assert values["pubsub_worker_oldest_unacked_age_seconds"] > 0
        assert values["messaging_process_duration_seconds_count"] == 3
        assert values["messaging_process_duration_seconds_bucket{le=+Inf}"] == 3
        assert values["pubsub_worker_step_duration_seconds_count"] == 4
        assert get(port, "/nowhere")[0] == 404
    finally:
        release.set()
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert not _answers(port)  # the endpoint stops with the worker


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def test_probes_report_a_streaming_pull_that_ended_with_a_fatal_error(
    subscriber: Any, make_subscription: Any
) -> None:
    """The stock client says so only through its future: the probes read it."""
    handle: SubscriptionHandle = make_subscription(exactly_once=True)
    health = Health()
    endpoint = MetricsServer(health, port=0, host=HOST)
    endpoint.start()
    try:
        assert get(endpoint.port, "/readyz") == (503, "starting\n")
        assert get(endpoint.port, "/livez") == (200, "ok\n")
        assert get(endpoint.port, "/metrics") == (503, "starting: no metrics yet\n")
        future = subscriber.subscribe(handle.subscription_path, callback=lambda m: m.ack())
        health.running(future)
        assert get(endpoint.port, "/readyz") == (200, "ok\n")

        subscriber.delete_subscription(request={"subscription": handle.subscription_path})
        wait_for(future.done)

        status, reason = get(endpoint.port, "/readyz")
        assert status == 503
        assert reason.startswith("the streaming pull ended: NotFound: 404")
        assert get(endpoint.port, "/livez") == (status, reason)
        health.stopping()  # a stop after the failure still reports the failure
        assert get(endpoint.port, "/readyz") == (status, reason)
    finally:
        endpoint.stop()


def test_a_requested_stop_is_not_ready_and_still_alive() -> None:
    health = Health()
    running: Future[None] = Future()
    health.running(running)
    assert health.ready() == (True, "ok")
    health.stopping()
    assert health.ready() == (False, "stopping: no new messages are taken")
    assert health.live() == (True, "ok")
    running.cancel()  # run() cancels the stream on a stop: not a failure
    assert health.live() == (True, "ok")


WITHOUT_PROMETHEUS = """
import sys
sys.modules["prometheus_client"] = None  # import fails as if the extra were not installed
from pubsub_worker.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_probes_answer_without_prometheus_client_and_metrics_says_what_to_install(
    emulators: Emulators,
    eod_subscription: SubscriptionHandle,
    firestore_collection: str,
    tmp_path: Any,
) -> None:
    """``pubsub-worker run --metrics-port`` without the extra: health only, one warning."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUBSUB_WORKER_")}
    env.update(
        emulators.env(),
        PUBSUB_WORKER_SUBSCRIPTION=eod_subscription.subscription_path,
        PUBSUB_WORKER_COLLECTION=firestore_collection,
        PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS="2",
        PUBSUB_WORKER_LOG_FORMAT="json",
    )
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WITHOUT_PROMETHEUS,
                "run",
                "tests.support.worker:handle_steps",
                "--metrics-port",
                str(port),
                "--metrics-host",
                HOST,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: process.poll() is not None or _answers(port))
        assert process.poll() is None, log_path.read_text()
        wait_for(lambda: get(port, "/readyz") == (200, "ok\n"))
        assert get(port, "/livez") == (200, "ok\n")
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/metrics") == (
            501,
            "/metrics needs prometheus-client: pip install 'pubsub-exactly-once[prometheus]'\n",
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert code == 0, records
    warnings = [r["message"] for r in records if r["level"] == "WARNING"]
    assert warnings == [
        f"serving /livez and /readyz on http://{HOST}:{port}; /metrics answers 501, it needs "
        "prometheus-client: pip install 'pubsub-exactly-once[prometheus]'"
    ]
