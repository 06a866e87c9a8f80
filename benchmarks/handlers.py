"""The wrapped callbacks under test (imported only by wrapped scenarios)."""

from __future__ import annotations

from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud.pubsub_v1.subscriber.message import Message

from benchmarks.scenarios import Scenario
from pubsub_worker import ExactlyOnce, Job, Settings
from pubsub_worker.store import JobStore
from pubsub_worker.stores import FirestoreJobStore

__all__ = ["STEP_NAMES", "build_wrapped"]

STEP_NAMES = ("fetch", "transform", "store")


def _handler(steps: int) -> Any:
    names = STEP_NAMES[:steps]

    def handle(message: Message, job: Job) -> None:
        for name in names:
            job.step(name, lambda: len(message.data))

    return handle


def _store(scenario: Scenario, client: Any, collection: str) -> JobStore | None:
    if scenario.store == "default":
        return None  # whatever exactly_once builds from the client
    if scenario.store == "direct":
        return FirestoreJobStore(client, collection)
    from pubsub_worker.stores.batching import BatchingFirestoreJobStore  # noqa: PLC0415

    return BatchingFirestoreJobStore(client, collection, **scenario.batching)


def build_wrapped(
    scenario: Scenario,
    *,
    subscription: str,
    project: str,
    collection: str,
    concurrency: int,
    firestore_client: Any,
    subscriber: pubsub_v1.SubscriberClient,
) -> ExactlyOnce:
    """An ``ExactlyOnce`` callback, started (settings read, EOD checked, clients warm)."""
    settings = Settings(
        subscription=subscription,
        project=project,
        collection=collection,
        max_messages=concurrency,
    )
    wrapped = ExactlyOnce(
        _handler(scenario.steps),
        settings=settings,
        firestore_client=firestore_client,
        store=_store(scenario, firestore_client, collection),
        subscriber=subscriber,
    )
    wrapped.start()
    firestore_client.collection(collection).document("warm-up").get(timeout=30)
    return wrapped
