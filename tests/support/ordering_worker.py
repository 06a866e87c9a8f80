"""A real worker process for ordering-key tests: ``python -m tests.support.ordering_worker``.

Configured like :mod:`tests.support.worker` (``PUBSUB_WORKER_*``,
``CHAOS_EFFECTS``; its hooks log every delivery, ack, nack and drop), plus:

``ORDERING_FAIL_ONCE``  comma-separated job keys whose first attempt raises ``RuntimeError``
                        (a failed attempt: released, counted and nacked)
``ORDERING_PERMANENT``  comma-separated job keys that raise ``PermanentError`` (review)

Every run of the handler appends an ``attempt`` effect; a job that does its
work appends ``done`` from inside its one step, ``work``, so a job whose work
is recorded never repeats it. Each effect line carries the message's id,
ordering key and publish time (seconds since the epoch, as Pub/Sub stamped it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import pubsub_worker
from pubsub_worker._support.logs import configure
from tests.support.production import production_acks
from tests.support.worker import ChaosHooks, effect


def _keys(name: str) -> frozenset[str]:
    return frozenset(key for key in os.environ.get(name, "").split(",") if key)


FAIL_ONCE = _keys("ORDERING_FAIL_ONCE")
PERMANENT = _keys("ORDERING_PERMANENT")


def handle(message: Any, job: pubsub_worker.Job) -> None:
    """Record the attempt; fail or review the jobs asked for; else do the work once."""
    seen = {
        "message_id": message.message_id,
        "ordering_key": message.ordering_key,
        "published": message.publish_time.timestamp(),
    }
    effect("attempt", job.key, job.epoch, attempt=job.attempt, **seen)
    if job.key in FAIL_ONCE and job.attempt == 1:
        raise RuntimeError("the first attempt of this job fails")
    if job.key in PERMANENT:
        raise pubsub_worker.PermanentError("this job can never be processed")

    def work() -> str:
        effect("done", job.key, job.epoch, **seen)
        return "done"

    job.step("work", work)


def main() -> int:
    configure("json", logging.INFO)
    production_acks()
    logging.getLogger("google").setLevel(logging.WARNING)
    print(json.dumps({"worker": "ready", "pid": os.getpid()}), flush=True)
    return pubsub_worker.run(handle, hooks=ChaosHooks())


if __name__ == "__main__":
    sys.exit(main())
