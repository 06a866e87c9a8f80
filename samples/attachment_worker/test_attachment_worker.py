"""The attachment worker end to end against the real emulators."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import pubsub_worker
from emulator import Emulators, drain_messages
from pubsub_worker._job.keys import document_id

from . import demo
from .worker import CHUNK_BYTES, card_settings, make_handler, output_id

pytestmark = pytest.mark.emulator


def attachment(content: bytes, claim_id: str = "C-1") -> bytes:
    encoded = base64.b64encode(content).decode()
    return json.dumps(
        {"claim_id": claim_id, "filename": "scan.raw", "content_b64": encoded}
    ).encode()


VALID = {
    "op-1": bytes(range(256)) * 40,  # 10 KiB: one chunk
    "op-2": bytes(range(256)) * 800,  # 200 KiB: four chunks
    "op-3": b"a small note",
}
MALFORMED = {
    "op-not-json": b"\x89PNG...",
    "op-no-content": json.dumps({"claim_id": "C-9", "filename": "a.pdf"}).encode(),
    "op-bad-base64": json.dumps({"claim_id": "C-9", "filename": "a", "content_b64": "%"}).encode(),
}


@pytest.fixture
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts ``job.heartbeat()`` calls per job key."""
    calls: Counter[str] = Counter()
    original = pubsub_worker.Job.heartbeat

    def heartbeat(job: pubsub_worker.Job) -> None:
        calls[job.key] += 1
        original(job)

    monkeypatch.setattr(pubsub_worker.Job, "heartbeat", heartbeat)
    return calls


@pytest.fixture
def running(
    make_subscription: Any, firestore_client: Any, firestore_collection: str
) -> Iterator[dict[str, Any]]:
    """The worker, in a thread, on fresh topics; yields what the test needs."""
    inbox = make_subscription(exactly_once=True, prefix="attachments")
    downstream = make_subscription(exactly_once=False, prefix="transcoded")
    review = make_subscription(exactly_once=False, prefix="failed")
    outputs = firestore_client.collection(f"{firestore_collection}-outputs")
    settings = card_settings(
        subscription=inbox.subscription_path,
        failure_topic=review.topic_path,
        collection=firestore_collection,
        shutdown_grace_seconds=2,
    )
    worker = pubsub_worker.exactly_once(
        make_handler(outputs, downstream.topic_path),
        settings=settings,
        firestore_client=firestore_client,
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=pubsub_worker.run, args=(worker,), kwargs={"settings": settings, "stop": stop}
    )
    thread.start()
    yield {
        "inbox": inbox,
        "downstream": downstream,
        "review": review,
        "outputs": outputs,
        "settings": settings,
        "worker": worker,
    }
    stop.set()
    thread.join(timeout=30)


def test_each_operation_is_transcoded_stored_and_announced_once(
    running: dict[str, Any],
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    heartbeats: Counter[str],
) -> None:
    settings, worker = running["settings"], running["worker"]
    assert (settings.key_attribute, settings.lease_seconds, settings.max_processing_seconds) == (
        "operation_id",
        150,
        480,
    )
    messages = [*VALID.items(), ("op-2", VALID["op-2"]), *MALFORMED.items()]  # op-2 twice
    for operation_id, content in messages:
        data = content if operation_id in MALFORMED else attachment(content)
        topic = running["inbox"].topic_path
        publisher.publish(topic, data, operation_id=operation_id).result()

    count = worker.metrics.get
    deadline = time.monotonic() + 30
    while count(pubsub_worker.Counter.COMPLETED) + count(pubsub_worker.Counter.FAILED) < 6 or (
        count(pubsub_worker.Counter.ALREADY_DONE) < 1
    ):
        assert time.monotonic() < deadline, worker.metrics.snapshot()
        time.sleep(0.05)
    assert count(pubsub_worker.Counter.COMPLETED) == 3
    assert count(pubsub_worker.Counter.ALREADY_DONE) == 1

    # Downstream: exactly one announcement per operation id, carrying the effect key.
    announced = drain_messages(subscriber, running["downstream"].subscription_path)
    assert Counter(m.attributes["operation_id"] for m in announced) == Counter(list(VALID))
    assert {m.attributes["effect_key"] for m in announced} == {
        f"{op}:store_output:0" for op in VALID
    }
    # The output, stored under the operation id, is the transcoded attachment.
    for operation_id, content in VALID.items():
        stored = running["outputs"].document(output_id(operation_id)).get().to_dict()
        assert zlib.decompress(stored["content"]) == content
        assert (stored["operation_id"], stored["epoch"]) == (operation_id, 1)
        chunks = max(1, -(-len(content) // CHUNK_BYTES))
        assert heartbeats[operation_id] == chunks  # progress reported per chunk

    # The malformed ones: on the failure topic and recorded failed, after one attempt.
    review = drain_messages(subscriber, running["review"].subscription_path)
    assert sorted(m.attributes["pubsub_worker_key"] for m in review) == sorted(MALFORMED)
    assert {m.attributes["pubsub_worker_reason"] for m in review} == {"permanent"}
    for operation_id in MALFORMED:
        ref = firestore_client.collection(settings.collection).document(
            document_id(settings.subscription_path, operation_id)
        )
        job = ref.get().to_dict()
        assert (job["status"], job["attempts"]) == ("failed", 1)
        assert job["error"].startswith("PermanentError: attachment ")


def test_the_demo_announces_every_operation_exactly_once(emulators: Emulators) -> None:
    lines: list[str] = []
    summary = demo.run_demo(emulators, out=lines.append)
    assert summary.ok, "\n".join(lines)
    assert summary.completed == 5
    assert summary.duplicates_skipped == 1
    assert list(summary.failed) == ["op-1006"]
    assert sum(summary.downstream.values()) == 5
    assert "exactly one per operation id" in "\n".join(lines)
    # Its end shows the jobs as `pubsub-worker jobs list` does, and the command that did it.
    shown = lines[lines.index("") + 1 :]
    command = next(line for line in shown if line.startswith("$ "))
    assert command.endswith(" jobs list")
    assert f"PUBSUB_EMULATOR_HOST={emulators.pubsub_host} " in command
    statuses = {line.split()[0]: line.split()[1] for line in shown if line.startswith("op-")}
    assert statuses == {**dict.fromkeys(summary.valid, "completed"), "op-1006": "failed"}
    assert shown[-1].startswith("6 job(s) on projects/")


def test_the_demo_kept_up_answers_the_jobs_commands_it_prints() -> None:
    """``--keep``: the printed command, run in another shell, shows the demo's failed job."""
    demo_run = subprocess.Popen(
        [sys.executable, "-m", "samples.attachment_worker.demo", "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo_run.stdout is not None
        printed: list[str] = []
        for line in demo_run.stdout:
            printed.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C to stop"):
                break
        told = printed[printed.index("the emulators stay up; in another shell, for example:") + 1]
        assert told.strip().endswith(" jobs show op-1006")
        shown = subprocess.run(
            ["bash", "-c", told], capture_output=True, text=True, timeout=60, check=False
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("job op-1006\n")
        assert "  status       failed (epoch 1, attempts 1)" in shown.stdout
    finally:
        demo_run.send_signal(signal.SIGINT)
        rest, _ = demo_run.communicate(timeout=60)
    assert demo_run.returncode == 0, "\n".join(printed) + rest
    assert rest.rstrip().endswith("emulators stopped")
