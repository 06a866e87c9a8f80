"""The Cloud Run sample against the real emulators: as a process, and as its container image.

On Cloud Run the worker must be done within 10 s of SIGTERM. Both tests
stop a worker in the middle of a long step and check that it exits 0 well
inside that window, having released the job (never acked), and that the
next worker charges the order once and publishes one receipt.

The container test needs a Docker engine and a base image; where there is
none it is skipped with the reason (README.md says what was found here).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle
from tests.support.observe import end_stale_streams, job_document, pull_now

pytestmark = pytest.mark.emulator

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "samples.cloud_run.handler:handle"
SIGTERM_WINDOW_S = 10.0
"""Cloud Run sends SIGKILL this long after SIGTERM."""
BASE_IMAGE = os.environ.get("SAMPLE_BASE_IMAGE", "pubsub-worker-base:bookworm")
DOCKER = os.environ.get("SAMPLE_DOCKER", "docker")


def order(order_id: str, cents: int) -> bytes:
    return json.dumps({"order_id": order_id, "amount_cents": cents}).encode()


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
def receipts(make_subscription: Any) -> SubscriptionHandle:
    handle: SubscriptionHandle = make_subscription(exactly_once=False)
    return handle


@pytest.fixture
def sample_env(
    emulators: Emulators,
    eod_subscription: SubscriptionHandle,
    firestore_collection: str,
    receipts: SubscriptionHandle,
) -> dict[str, str]:
    """The worker's environment on Cloud Run, pointed at the emulators."""
    return {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": eod_subscription.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "order_id",
        "PUBSUB_WORKER_LEASE_SECONDS": "10",
        "RECEIPTS_TOPIC": receipts.topic_path,
        "CLOUD_RUN_WORKER_POOL": "orders-worker",
    }


def test_the_worker_stops_inside_cloud_runs_sigterm_window_and_charges_once(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    receipts: SubscriptionHandle,
    sample_env: dict[str, str],
    tmp_path: Path,
) -> None:
    sub = eod_subscription.subscription_path
    log_path = tmp_path / "worker.log"

    def start(charge_s: float) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "pubsub_worker.cli", "run", HANDLER],
                cwd=ROOT,
                env={**os.environ, **sample_env, "ORDER_CHARGE_SECONDS": str(charge_s)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    first = start(charge_s=60)
    try:
        wait_for(lambda: "consuming projects/" in log_path.read_text(), what="the worker")
        publisher.publish(eod_subscription.topic_path, order("o-1", 1250), order_id="o-1").result()
        wait_for(
            lambda: status_of(firestore_client, firestore_collection, sub, "o-1") == "running",
            what="the charge to start",
        )
        started = time.monotonic()
        first.terminate()  # what Cloud Run sends on scale-in or a new revision
        assert first.wait(timeout=SIGTERM_WINDOW_S + 5) == 0
        elapsed = time.monotonic() - started
    finally:
        if first.poll() is None:
            first.kill()
    print(f"stopped {elapsed:.1f} s after SIGTERM")
    log = log_path.read_text()
    assert "on Cloud Run (CLOUD_RUN_WORKER_POOL is set): shutdown grace 5 s" in log
    assert elapsed < SIGTERM_WINDOW_S - 2, f"stopped after {elapsed:.1f} s"
    assert status_of(firestore_client, firestore_collection, sub, "o-1") == "released"
    assert "charged order" not in log

    end_stale_streams(subscriber, sub)
    second = start(charge_s=0)
    try:
        wait_for(
            lambda: status_of(firestore_client, firestore_collection, sub, "o-1") == "completed",
            timeout_s=90,
            what="the redelivered order",
        )
        second.terminate()
        assert second.wait(timeout=SIGTERM_WINDOW_S) == 0
    finally:
        if second.poll() is None:
            second.kill()
    assert log_path.read_text().count("charged order o-1: 1250 cents") == 1
    doc = job_document(firestore_client, firestore_collection, sub, "o-1")
    assert (doc["epoch"], doc["attempts"]) == (2, 1)  # a stop gives its attempt back
    assert [
        json.loads(m.message.data)["order_id"]
        for m in pull_now(subscriber, receipts.subscription_path)
    ] == ["o-1"]


# -- the container image ----------------------------------------------------------


def docker(*args: str, timeout_s: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr or done.stdout}")
    return done.stdout


def docker_or_skip() -> None:
    """Skip, saying why, unless a Docker engine answers and the base image is there."""
    if shutil.which(DOCKER) is None:
        pytest.skip(f"no Docker client ({DOCKER}); see samples/cloud_run/README.md")
    info = subprocess.run(
        [DOCKER, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if info.returncode != 0:
        why = (info.stderr or info.stdout).strip().splitlines()[-1:] or ["no answer"]
        pytest.skip(f"no Docker engine answers ({why[0]}); see samples/cloud_run/README.md")
    present = subprocess.run(
        [DOCKER, "image", "inspect", BASE_IMAGE], capture_output=True, timeout=30, check=False
    )
    if present.returncode != 0:
        pytest.skip(
            f"base image {BASE_IMAGE} is not there and no registry is reachable: make it with "
            "samples/cloud_run/local_base.sh (or set SAMPLE_BASE_IMAGE)"
        )


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    docker_or_skip()
    tag = f"pubsub-worker-sample:test-{os.getpid()}"
    build = ["build", "--network", "host", "--build-arg", f"BASE={BASE_IMAGE}"]
    built = subprocess.run(
        [DOCKER, *build, "-f", "samples/cloud_run/Dockerfile", "-t", tag, "."],
        cwd=ROOT,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if built.returncode != 0 and "buildx" in built.stderr:
        # Dockerfile.dockerignore needs BuildKit; without it the context is the whole tree.
        pytest.skip(f"{DOCKER} cannot build with BuildKit: {built.stderr.strip()[:200]}")
    assert built.returncode == 0, built.stderr[-4000:]
    yield tag
    docker("image", "rm", "-f", tag, check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Container:
    """A detached container of the sample on the host's network (loopback emulators)."""

    def __init__(self, image: str, env: dict[str, str], port: int) -> None:
        flags = [f"--env={name}={value}" for name, value in env.items()]
        self.port = port
        self.id = docker(
            "run",
            "--detach",
            "--network",
            "host",
            *flags,
            image,
            HANDLER,
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
        ).strip()

    def logs(self) -> str:
        done = subprocess.run(
            [DOCKER, "logs", self.id], capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout + done.stderr

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except OSError as exc:
            return getattr(exc, "code", 0), str(exc)

    def stop(self) -> tuple[int, float]:
        """``docker stop -t 10``: SIGTERM, SIGKILL 10 s later, as Cloud Run does."""
        started = time.monotonic()
        docker("stop", "--time", str(int(SIGTERM_WINDOW_S)), self.id, timeout_s=60)
        elapsed = time.monotonic() - started
        code = int(docker("inspect", "--format", "{{.State.ExitCode}}", self.id).strip())
        return code, elapsed

    def remove(self) -> None:
        docker("rm", "-f", self.id, check=False)


def completed(client: Any, collection: str, subscription: str, key: str) -> Callable[[], bool]:
    return lambda: status_of(client, collection, subscription, key) == "completed"


def test_the_image_runs_the_worker_serves_metrics_and_stops_inside_the_window(
    image: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    receipts: SubscriptionHandle,
    sample_env: dict[str, str],
) -> None:
    sub = eod_subscription.subscription_path
    slow = Container(image, {**sample_env, "ORDER_CHARGE_SECONDS": "60"}, free_port())
    try:
        wait_for(lambda: slow.get("/readyz") == (200, "ok\n"), what="the container")
        publisher.publish(eod_subscription.topic_path, order("o-1", 1250), order_id="o-1").result()
        wait_for(
            lambda: status_of(firestore_client, firestore_collection, sub, "o-1") == "running",
            what="the charge to start",
        )
        code, elapsed = slow.stop()
        logs = slow.logs()
    finally:
        slow.remove()
    print(f"container stopped {elapsed:.1f} s after SIGTERM")
    assert code == 0, logs
    assert elapsed < SIGTERM_WINDOW_S - 2, f"stopped after {elapsed:.1f} s:\n{logs}"
    assert "shutdown grace 5 s" in logs
    assert status_of(firestore_client, firestore_collection, sub, "o-1") == "released"

    end_stale_streams(subscriber, sub)
    fast = Container(image, {**sample_env, "ORDER_CHARGE_SECONDS": "0"}, free_port())
    try:
        wait_for(lambda: fast.get("/readyz") == (200, "ok\n"), what="the second container")
        for _ in range(2):  # o-2 twice, as a retrying upstream would
            publisher.publish(
                eod_subscription.topic_path, order("o-2", 990), order_id="o-2"
            ).result()
        for key in ("o-1", "o-2"):
            wait_for(completed(firestore_client, firestore_collection, sub, key), 90, key)
        wait_for(lambda: "pubsub_worker_already_done_total 1.0" in fast.get("/metrics")[1])
        status, metrics = fast.get("/metrics")
        code, _ = fast.stop()
        logs = fast.logs()
    finally:
        fast.remove()
    assert status == 200
    assert "pubsub_worker_completed_total 2.0" in metrics
    assert code == 0, logs
    assert logs.count("charged order o-1: 1250 cents") == 1
    assert logs.count("charged order o-2: 990 cents") == 1
    receipts_sent = [
        json.loads(m.message.data)["order_id"]
        for m in pull_now(subscriber, receipts.subscription_path)
    ]
    assert sorted(receipts_sent) == ["o-1", "o-2"]
