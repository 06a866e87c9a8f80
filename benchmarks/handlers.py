"""The wrapped callbacks under test (imported only by scenarios that use the wrapper)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud.pubsub_v1.subscriber.message import Message

from benchmarks.scenarios import Scenario
from pubsub_worker import AsyncJob, ExactlyOnce, Hooks, Job, Settings
from pubsub_worker._delivery import acks
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores.base import JobStore

__all__ = ["STEP_NAMES", "build_wrapped"]

STEP_NAMES = ("fetch", "transform", "store")

Note = Callable[[Message], None]
"""Called with each message a handler sees (``run()`` gives no other place to see it)."""


def _handler(steps: int, note: Note | None, io_s: float) -> Any:
    names = STEP_NAMES[:steps]

    def handle(message: Message, job: Job) -> None:
        if note is not None:
            note(message)
        for name in names:

            def work() -> int:
                if io_s:
                    time.sleep(io_s)  # a call to another service
                return len(message.data)

            job.step(name, work)

    return handle


def _async_handler(steps: int, note: Note | None, io_s: float) -> Any:
    """The same work as :func:`_handler`, as an ``async def`` awaiting its steps."""
    names = STEP_NAMES[:steps]

    async def handle(message: Message, job: AsyncJob) -> None:
        if note is not None:
            note(message)
        for name in names:

            async def work() -> int:
                if io_s:
                    await asyncio.sleep(io_s)  # a call to another service
                return len(message.data)

            await job.step(name, work)

    return handle


def _legacy(message: Message) -> None:
    """The stock EOD scenario's callback, unchanged: what a team has before the one line."""
    message.ack_with_response().result(timeout=60)


def _store(scenario: Scenario, client: Any, collection: str) -> JobStore | None:
    if scenario.store == "default":
        return None  # whatever exactly_once builds from the client
    if scenario.store == "direct":
        return FirestoreJobStore(client, collection)
    if scenario.store == "memory":
        from pubsub_worker.stores.memory import MemoryJobStore  # noqa: PLC0415

        return MemoryJobStore()
    from pubsub_worker.stores.batching import BatchingFirestoreJobStore  # noqa: PLC0415

    return BatchingFirestoreJobStore(client, collection, **scenario.batching)


def build_wrapped(
    scenario: Scenario,
    *,
    subscription: str,
    project: str,
    collection: str,
    firestore_client: Any,
    subscriber: pubsub_v1.SubscriberClient,
    hooks: Hooks,
    note: Note | None = None,
) -> ExactlyOnce:
    """An ``ExactlyOnce`` callback, started (settings read, EOD checked, clients warm).

    Settings are the library's defaults apart from where to work: in
    particular ``MAX_MESSAGES`` stays at its default, which only ``run()`` reads.
    """
    settings = Settings(subscription=subscription, project=project, collection=collection)
    if scenario.stock_acks:  # read when the wrapper is built: no direct ack, no probe
        acks.SLOW_AFTER_S = acks.PROBE_S = float("inf")
    io_s = scenario.step_io_ms / 1000
    if scenario.kind == "legacy":
        handler: Any = _legacy
    elif scenario.asynchronous:
        handler = _async_handler(scenario.steps, note, io_s)
    else:
        handler = _handler(scenario.steps, note, io_s)
    wrapped = ExactlyOnce(
        handler,
        settings=settings,
        firestore_client=firestore_client,
        store=_store(scenario, firestore_client, collection),
        subscriber=subscriber,
        hooks=hooks,
    )
    wrapped.start()
    firestore_client.collection(collection).document("warm-up").get(timeout=30)
    return wrapped
