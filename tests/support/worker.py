"""A real worker process for crash-window tests: ``python -m tests.support.worker``.

Configured by ``PUBSUB_WORKER_*`` (the library's own settings) plus:

``CHAOS_EFFECTS``   file that every effect appends one JSON line to (O_APPEND, fsync)
``CHAOS_SCENARIO``  ``steps`` (default: steps a, b, c), ``always_fail``, ``permanent``,
                    ``outbox`` (step ``produce`` publishes to ``CHAOS_OUTPUT_TOPIC``),
                    ``transactional`` (step ``write`` changes ``CHAOS_SINK_COLLECTION``),
                    ``legacy`` (an unchanged ``callback(message)`` that acks)
``CHAOS_KILL_AT``   SIGKILL this process once (a marker file remembers) at a named point:
                    ``step:NAME`` inside step NAME; ``before_ack`` after the completion
                    record, before the ack; ``before_publish`` after an outbox entry is
                    committed, before it is published; ``after_publish`` after the outbox
                    publish, before the completion
``CHAOS_STEP_SLEEP_S``  seconds each step sleeps (widens pause windows)

Each effect line: ``{"effect": step, "key": job key, "epoch": n, "pid": pid}``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any

import pubsub_worker
from pubsub_worker import job as job_module
from pubsub_worker import wrapper as wrapper_module
from pubsub_worker.logs import configure


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


EFFECTS = _env("CHAOS_EFFECTS")
KILL_AT = _env("CHAOS_KILL_AT")
SCENARIO = _env("CHAOS_SCENARIO", "steps")
SLEEP_S = float(_env("CHAOS_STEP_SLEEP_S", "0") or 0)


def effect(name: str, key: str, epoch: int, **extra: Any) -> None:
    """Record one externally visible effect, durably, before returning."""
    line = json.dumps({"effect": name, "key": key, "epoch": epoch, "pid": os.getpid(), **extra})
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def maybe_die(point: str) -> None:
    """SIGKILL this process the first time ``point`` is reached, if asked to."""
    marker = EFFECTS + ".killed"
    if point == KILL_AT and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(str(os.getpid()))
        effect("killed", point, 0)
        os.kill(os.getpid(), signal.SIGKILL)


def _patch_kill_points() -> None:
    original_ack = wrapper_module.ExactlyOnce._ack

    def ack(self: Any, rt: Any, message: Any, log: Any) -> None:
        maybe_die("before_ack")
        original_ack(self, rt, message, log)

    wrapper_module.ExactlyOnce._ack = ack  # type: ignore[method-assign]

    original_publish = job_module.Job._publish_unsent

    def publish_unsent(self: Any) -> None:
        if self._unsent:
            maybe_die("before_publish")
        original_publish(self)
        maybe_die("after_publish")

    job_module.Job._publish_unsent = publish_unsent  # type: ignore[method-assign]


def _step(job: pubsub_worker.Job, name: str) -> str:
    def run() -> str:
        maybe_die(f"step:{name}")
        if SLEEP_S:
            deadline = time.monotonic() + SLEEP_S
            while time.monotonic() < deadline:
                time.sleep(0.2)
        effect(name, job.key, job.epoch)
        return f"{name}-done"

    return job.step(name, run)


def handle_steps(message: Any, job: pubsub_worker.Job) -> None:
    for name in ("a", "b", "c"):
        _step(job, name)


def handle_always_fail(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise RuntimeError("this job always fails")


def handle_permanent(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise pubsub_worker.PermanentError("payload can never be processed")


def handle_outbox(message: Any, job: pubsub_worker.Job) -> None:
    topic = _env("CHAOS_OUTPUT_TOPIC")

    def produce() -> str:
        effect("produce", job.key, job.epoch)
        job.publish(topic, b"output:" + message.data, source="chaos")
        return "produced"

    job.step("produce", produce)


def handle_transactional(message: Any, job: pubsub_worker.Job) -> None:
    from google.cloud import firestore

    collection = _env("CHAOS_SINK_COLLECTION")
    client = firestore.Client()

    def write(transaction: Any) -> str:
        if SLEEP_S:
            time.sleep(SLEEP_S)
        ref = client.collection(collection).document()
        transaction.set(ref, {"key": job.key, "epoch": job.epoch, "pid": os.getpid()})
        return ref.id

    job.transactional_step("write", write)
    effect("write", job.key, job.epoch)


def handle_legacy(message: Any) -> None:
    effect("legacy", message.message_id, 0)
    message.ack()


HANDLERS = {
    "steps": handle_steps,
    "always_fail": handle_always_fail,
    "permanent": handle_permanent,
    "outbox": handle_outbox,
    "transactional": handle_transactional,
    "legacy": handle_legacy,
}


def main() -> int:
    configure("json", logging.INFO)
    logging.getLogger("google").setLevel(logging.WARNING)
    _patch_kill_points()
    print(json.dumps({"worker": "ready", "pid": os.getpid()}), flush=True)
    return pubsub_worker.run(HANDLERS[SCENARIO])


if __name__ == "__main__":
    sys.exit(main())
