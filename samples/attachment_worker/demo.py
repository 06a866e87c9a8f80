"""The attachment worker end to end, on local emulators, in one command.

``python -m samples.attachment_worker.demo`` (or ``nox -s demo``):
starts the Pub/Sub and Firestore emulators, creates the topology of
``topology.toml``, publishes a handful of attachments (one operation published
twice, one malformed), runs the worker in this process until every job is
completed or failed, prints a summary and stops everything. Nothing to
configure. Exit status 0 when each valid operation was announced downstream
exactly once and the malformed one reached the failure path; 1 otherwise;
2 when the emulators cannot start.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore

import pubsub_worker
from emulator import EmulatorError, Emulators, drain_messages, load_topology, start_emulators

from .worker import OUTPUT_COLLECTION, OUTPUT_TOPIC, card_settings, make_handler

__all__ = ["Summary", "main", "run_demo", "sample_attachments"]

PROJECT = "attachment-demo"
TOPOLOGY = Path(__file__).with_name("topology.toml")
JOBS_COLLECTION = "attachment_jobs"
TIMEOUT_S = 60.0


@dataclass
class Summary:
    """What the demo saw; ``ok`` says whether it is exactly what should happen."""

    valid: list[str]
    """Operation ids of the well-formed attachments."""
    completed: int = 0
    duplicates_skipped: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    """Operation id to the error, from the failure topic."""
    downstream: Counter[str] = field(default_factory=Counter)
    """Operation id to the number of messages the output topic received for it."""
    stored: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.completed == len(self.valid)
            and self.duplicates_skipped == 1
            and list(self.failed) == ["op-1006"]
            and self.downstream == Counter(self.valid)  # exactly one per operation id
            and self.stored == len(self.valid)
        )


def _scan(seed: int, size: int) -> bytes:
    """Deterministic, image-like bytes: a gradient with a little noise."""
    noise = random.Random(seed).randbytes(size)
    return bytes((i // 512 + i % 512 + (n & 7)) & 0xFF for i, n in enumerate(noise))


def _attachment(claim_id: str, filename: str, content: bytes) -> bytes:
    encoded = base64.b64encode(content).decode()
    return json.dumps({"claim_id": claim_id, "filename": filename, "content_b64": encoded}).encode()


def sample_attachments() -> list[tuple[str, bytes]]:
    """``(operation_id, data)``: five attachments, the second published twice, one malformed."""
    sizes_kib = [24, 96, 160, 256, 400]
    valid = [
        (f"op-100{n}", _attachment(f"C-{40 + n}", f"scan-{n}.raw", _scan(n, kib * 1024)))
        for n, kib in enumerate(sizes_kib, start=1)
    ]
    duplicate = valid[1]  # an upstream retry: the same operation, published again
    malformed = ("op-1006", b'{"claim_id": "C-46", "filename": "x.raw", "content_b64": "%%%"}')
    return [*valid[:3], duplicate, *valid[3:], malformed]


def run_demo(emu: Emulators, out: Callable[[str], None] = print) -> Summary:
    """Run the worker on the emulators' topology until every job finished; summarise."""
    made = emu.bootstrap(load_topology(TOPOLOGY))
    settings = card_settings(
        project=emu.project,
        subscription=made.subscriptions["attachments-worker"],
        failure_topic=made.topics["attachments-failed"],
        collection=JOBS_COLLECTION,
        shutdown_grace_seconds=5,
    )
    client = firestore.Client(project=emu.project)
    outputs = client.collection(OUTPUT_COLLECTION)
    handler = make_handler(outputs, made.topics[OUTPUT_TOPIC])
    worker = pubsub_worker.exactly_once(handler, settings=settings, firestore_client=client)
    stop = threading.Event()
    failure: list[Exception] = []

    def run_worker() -> None:
        try:
            pubsub_worker.run(worker, settings=settings, stop=stop)
        except Exception as exc:  # noqa: BLE001 - reported by the progress loop
            failure.append(exc)

    thread = threading.Thread(target=run_worker, name="attachment-worker", daemon=True)
    thread.start()

    attachments = sample_attachments()
    publisher = pubsub_v1.PublisherClient()
    for operation_id, data in attachments:
        publisher.publish(made.topics["attachments"], data, operation_id=operation_id).result()
    jobs = len({operation_id for operation_id, _ in attachments})
    out(f"published {len(attachments)} messages: {jobs} operations, one of them twice")

    try:
        _wait(worker, jobs, len(attachments), failure, out)
    finally:
        stop.set()
        thread.join(timeout=30)

    summary = Summary(valid=sorted({op for op, _ in attachments if op != "op-1006"}))
    summary.completed = worker.metrics.get(pubsub_worker.Counter.COMPLETED)
    summary.duplicates_skipped = worker.metrics.get(pubsub_worker.Counter.ALREADY_DONE)
    for message in _drain(made.subscriptions["attachments-transcoded-downstream"]):
        summary.downstream[message.attributes["operation_id"]] += 1
    for message in _drain(made.subscriptions["attachments-failed-review"]):
        key = message.attributes["pubsub_worker_key"]
        summary.failed[key] = message.attributes["pubsub_worker_error"]
    summary.stored = sum(1 for _ in outputs.stream())
    client.close()  # type: ignore[no-untyped-call]
    _print_summary(summary, out)
    return summary


def _wait(
    worker: pubsub_worker.ExactlyOnce,
    jobs: int,
    messages: int,
    failure: list[Exception],
    out: Callable[[str], None],
) -> None:
    """Wait until every job is completed or failed and every message was handled."""
    deadline = time.monotonic() + TIMEOUT_S
    last = ""
    while True:
        if failure:
            raise RuntimeError("the worker stopped") from failure[0]
        count = worker.metrics.get
        completed = count(pubsub_worker.Counter.COMPLETED)
        failed = count(pubsub_worker.Counter.FAILED)
        handled = completed + failed + count(pubsub_worker.Counter.ALREADY_DONE)
        line = (
            f"  progress: {completed + failed}/{jobs} jobs finished "
            f"({completed} completed, {failed} failed), {handled}/{messages} messages handled"
        )
        if line != last:
            out(line)
            last = line
        if completed + failed >= jobs and handled >= messages:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not finished after {TIMEOUT_S:.0f} s: {line.strip()}")
        time.sleep(0.1)


def _drain(subscription: str) -> list[Any]:
    """Pull and ack until nothing arrives for a second."""
    subscriber = pubsub_v1.SubscriberClient()
    try:
        return drain_messages(subscriber, subscription, quiet_s=1.0)
    finally:
        subscriber.close()


def _print_summary(summary: Summary, out: Callable[[str], None]) -> None:
    once = summary.downstream == Counter(summary.valid)
    rows = [
        ("jobs completed", str(summary.completed), ""),
        ("duplicates skipped", str(summary.duplicates_skipped), "acked without running"),
        (
            "failed for review",
            str(len(summary.failed)),
            "; ".join(f"{op}: {error}" for op, error in summary.failed.items()),
        ),
        (
            "outputs published downstream",
            str(sum(summary.downstream.values())),
            "exactly one per operation id"
            if once
            else f"NOT one per operation id: {dict(summary.downstream)}",
        ),
        ("outputs stored in Firestore", str(summary.stored), ""),
    ]
    out("")
    out("summary")
    for label, value, note in rows:
        out(f"  {label:<30} {value:>3}  {note}".rstrip())
    out("")
    out("OK: every operation took effect exactly once" if summary.ok else "FAILED: see above")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samples.attachment_worker.demo")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the worker's log")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="  log: %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # the malformed attachment's failure is expected: the summary shows it
        logging.getLogger("pubsub_worker._job.failure").setLevel(logging.CRITICAL)
    print("starting the local Pub/Sub and Firestore emulators...", flush=True)
    try:
        emu = start_emulators(PROJECT)
    except EmulatorError as exc:
        print(f"cannot start the emulators: {exc}", file=sys.stderr)
        return 2
    with emu:
        emu.export_env()  # the clients find the emulators through these variables
        print(f"  ready in {emu.startup_s:.1f} s", flush=True)
        summary = run_demo(emu, out=lambda line: print(line, flush=True))
    print("emulators stopped")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
