"""A real worker process for handler shapes ``tests.support.worker`` lacks.

``python -m tests.support.adoption_worker``, configured like
:mod:`tests.support.worker` (``PUBSUB_WORKER_*``, ``CHAOS_EFFECTS``,
``CHAOS_KILL_AT``, ``CHAOS_OUTPUT_TOPIC``; its hooks log every delivery and
ack, and kill the process at a named point), plus:

``ADOPTION_SCENARIO``  ``async_publish_ack``: an existing ``async def callback(message)``
                       that publishes through ``message.job.publish()`` outside any step,
                       then calls ``message.ack()`` (effect ``publish`` once per run)
``ADOPTION_RUNNER``    ``run`` (:func:`pubsub_worker.run`, the default) or ``subscribe``
                       (the user's own ``SubscriberClient().subscribe(path,
                       callback=exactly_once(callback))``, with leases extended by
                       ``PUBSUB_WORKER_LEASE_SECONDS`` at a time so that a killed
                       worker's message comes back after one lease, not 60 s)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1

import pubsub_worker
from pubsub_worker._support.logs import configure
from tests.support.production import production_acks
from tests.support.worker import ChaosHooks, effect


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


async def async_publish_ack(message: Any) -> None:
    """An unchanged ``async def`` callback: publish a result, then ack."""
    job = message.job
    effect("publish", job.key, job.epoch, flavour="async")
    message.job.publish(_env("CHAOS_OUTPUT_TOPIC"), b"output:" + message.data, source="adoption")
    await asyncio.sleep(0)
    message.ack()


SCENARIOS: dict[str, Callable[..., Any]] = {"async_publish_ack": async_publish_ack}


def _subscribe(wrapped: pubsub_worker.ExactlyOnce) -> int:
    """The user's own subscriber, as an existing program runs it, until SIGTERM."""
    wrapped.start()
    settings = wrapped.settings
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    subscriber = pubsub_v1.SubscriberClient()
    future = subscriber.subscribe(
        settings.subscription_path,
        callback=wrapped,
        flow_control=pubsub_v1.types.FlowControl(
            min_duration_per_lease_extension=settings.lease_seconds,
            max_duration_per_lease_extension=settings.lease_seconds,
        ),
    )
    with subscriber:
        while not stop.wait(0.5):
            if future.done():
                future.result()
        wrapped.drain(30)
        future.cancel()
        future.result(timeout=30)
    wrapped.close()
    return 0


def main() -> int:
    configure("json", logging.INFO)
    production_acks()
    logging.getLogger("google").setLevel(logging.WARNING)
    callback = SCENARIOS[_env("ADOPTION_SCENARIO", "async_publish_ack")]
    print(json.dumps({"worker": "ready", "pid": os.getpid()}), flush=True)
    if _env("ADOPTION_RUNNER", "run") == "subscribe":
        return _subscribe(pubsub_worker.exactly_once(callback, hooks=ChaosHooks()))
    return pubsub_worker.run(callback, hooks=ChaosHooks())


if __name__ == "__main__":
    sys.exit(main())
