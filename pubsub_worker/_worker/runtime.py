"""The runtime of a worker, built once from its settings: clients, store, keeper, failure path.

:func:`build` reads nothing from the environment (the settings are given)
and checks what can be checked before the first message: Firestore answers,
the subscription has exactly-once delivery (unless ``ALLOW_AT_LEAST_ONCE``),
and the failure topic, when one is configured, exists. Each failed check is
a :class:`~pubsub_worker.errors.ConfigError` or
:class:`~pubsub_worker.errors.Unreachable` naming what to fix.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import google.cloud.pubsub_v1 as pubsub_v1
from google.api_core import exceptions as gexc
from google.cloud import firestore

from pubsub_worker._delivery.acks import Acks
from pubsub_worker._delivery.generations import DeliveryTracker, KeyGate, OrderingKeys
from pubsub_worker._delivery.lease import LeaseKeeper
from pubsub_worker._job.context import JobContext, Publish
from pubsub_worker._job.failure import FailurePath
from pubsub_worker._support import clients
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.errors import ConfigError, Unreachable
from pubsub_worker.hooks import Hooks
from pubsub_worker.settings import Settings
from pubsub_worker.stores import base as s
from pubsub_worker.stores import job_index
from pubsub_worker.stores.base import JobStore, Review, Status
from pubsub_worker.stores.batching import BatchingFirestoreJobStore
from pubsub_worker.stores.continued import continues
from pubsub_worker.stores.firestore import FirestoreJobStore
from pubsub_worker.stores.memory import MemoryJobStore

from .completer import Completer

__all__ = [
    "Runtime",
    "build",
    "check_failure_topic",
    "check_pending_reviews",
    "check_subscription",
]

_LOGGER = logging.getLogger("pubsub_worker")

_CHECK_TIMEOUT_S = 10.0


@dataclass
class Runtime:
    """Everything one worker shares between its deliveries."""

    settings: Settings
    store: JobStore
    publish: Publish
    tracker: DeliveryTracker
    gate: KeyGate
    keeper: LeaseKeeper
    metrics: Metrics
    failure: FailurePath
    context: JobContext
    hooks: Hooks
    owner: str
    """This process's worker id: host/pid/random."""
    completer: Completer
    """Concludes deliveries whose handler returned, off their callback threads (once opened:
    only a caller that drains it before closing the stream may, as :func:`run` does)."""
    acks: Acks
    """Sends the acks of stock clients' messages straight to Pub/Sub, several RPCs at once."""
    draining: threading.Event
    """Set when the worker stops taking messages: a delivery not yet claimed is nacked."""
    ordering: OrderingKeys | None
    """Messages of an ordering key that ended here without being done: later ones wait
    (None for a push endpoint: Pub/Sub pushes a key's next message only after a 2xx)."""
    checked: bool = False
    """The subscription and failure topic were checked."""
    continued: bool = False
    """The store tells when a write is done (a
    :class:`~pubsub_worker.stores.continued.ContinuedStore`): a completion need not be
    waited for on its callback thread."""

    @functools.cached_property
    def subscription(self) -> str:
        """The subscription's full path (``settings.subscription_path``), resolved once."""
        return self.settings.subscription_path

    @functools.cached_property
    def replay_subscription(self) -> str:
        """Where its replays arrive (``settings.replay_subscription_path``), resolved once."""
        return self.settings.replay_subscription_path


def build(
    settings: Settings,
    *,
    store: JobStore | None,
    firestore_client: firestore.Client | None,
    publisher: pubsub_v1.PublisherClient | None,
    hooks: Hooks,
    stopping: threading.Event,
    draining: threading.Event,
    ordering: bool = True,
    arriving: Callable[[], int | None] | None = None,
) -> Runtime:
    """Clients, store and helpers for ``settings``; checks Firestore when it makes the client.

    ``ordering``: keep the ordering keys' memory (a push endpoint has none).
    ``arriving``: how many messages received wait for a callback thread, where the
    worker can tell (:attr:`~pubsub_worker.stores._slots.Slots.arriving`).
    """
    subscription = settings.subscription_path  # ConfigError when unset
    if store is None:
        client = firestore_client or clients.firestore_client(settings)
        if firestore_client is None:
            clients.check_firestore(client, settings)
        store = BatchingFirestoreJobStore(client, settings.collection)
    publish = clients.publisher_function(publisher or clients.publisher_client(settings))
    metrics = Metrics()
    tracker = DeliveryTracker()
    if isinstance(store, BatchingFirestoreJobStore):  # a batch is held open for other jobs
        store.batcher.slots.writers = tracker.__len__
        store.batcher.slots.arriving = arriving
    keeper = LeaseKeeper(
        lease_s=settings.lease_seconds,
        max_processing_s=settings.max_processing_seconds,
        metrics=metrics,
    )
    metrics.gauge("in_flight", keeper.in_flight, "Jobs being processed now")
    metrics.gauge(
        "oldest_unacked_age_s", keeper.oldest_age_s, "Age of the oldest message in flight"
    )
    slots = settings.max_messages
    metrics.gauge(
        "utilization",
        lambda: min(keeper.watched() / slots, 1.0),
        "Messages in the worker's hands / MAX_MESSAGES: the signal to autoscale on",
    )
    metrics.gauge("outbox_pending", keeper.unsent, "Committed outbox entries not yet published")
    retention_s = settings.retention_days * 86400.0
    context = JobContext(
        store=store,
        tracker=tracker,
        metrics=metrics,
        publish=publish,
        topic_path=settings.topic_path,
        lease_s=settings.lease_seconds,
        retention_s=retention_s,
        io_timeout_s=settings.ack_timeout_seconds,
        outbox_key_attribute=settings.outbox_key_attribute,
        stopping=stopping,
        hooks=hooks,
    )
    failure = FailurePath(
        store=store,
        subscription=subscription,
        publish=publish,
        failure_topic=settings.failure_topic_path,
        metrics=metrics,
        retention_s=retention_s,
        io_timeout_s=settings.ack_timeout_seconds,
        hooks=hooks,
    )
    return Runtime(
        settings=settings,
        store=store,
        publish=publish,
        tracker=tracker,
        gate=KeyGate(tracker, draining),
        keeper=keeper,
        metrics=metrics,
        failure=failure,
        context=context,
        hooks=hooks,
        owner=f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}",
        completer=Completer(settings.max_messages, taking=False),  # run() opens it
        acks=Acks(),
        draining=draining,
        continued=continues(store),
        ordering=(
            OrderingKeys(expiry_s=max(2.0 * settings.lease_seconds, 60.0)) if ordering else None
        ),
    )


def check_subscription(settings: Settings, subscriber: pubsub_v1.SubscriberClient) -> None:
    """ConfigError for a subscription without exactly-once delivery (unless allowed)."""
    if clients.read_subscription(subscriber, settings).enable_exactly_once_delivery:
        return
    if not settings.allow_at_least_once:
        raise ConfigError(
            f"subscription {settings.subscription_path} does not have exactly-once delivery "
            "enabled: a stale ack would be indistinguishable from a real one. Enable it "
            "(gcloud pubsub subscriptions update --enable-exactly-once-delivery) or set "
            "PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE=true to accept at-least-once acks."
        )
    _LOGGER.warning(
        "PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE is set and the subscription has no "
        "exactly-once delivery: acks resolve without proof, a lapsed lease is not "
        "detected by Pub/Sub, and only the Firestore epoch fences stale workers"
    )


def check_pending_reviews(rt: Runtime) -> None:
    """ConfigError when failed jobs wait for their failure message and no failure topic is set.

    A job failed while ``FAILURE_TOPIC`` was set is recorded ``review: pending`` until
    its failure message is out; a worker started without the variable could never publish
    it (its deliveries are deferred, never acked). ``review`` is exempt from indexing: the
    most recently written failed jobs are read (``job_index.REVIEW_READS``), through the
    listing index; when that cannot be read, the start goes on (said in the log).
    """
    if rt.settings.failure_topic_path is not None:
        return
    subscription = rt.settings.subscription_path
    store = rt.store
    index: job_index.JobIndex
    if isinstance(store, FirestoreJobStore):
        index = job_index.FirestoreJobIndex(store.client, store.collection, subscription)
    elif isinstance(store, MemoryJobStore):
        index = job_index.MemoryJobIndex(store, subscription)
    else:
        return  # a store of the user's: nothing to list it by
    try:
        rows = index.newest(Status.FAILED, limit=job_index.REVIEW_READS, fields=[s.REVIEW])
    except Exception as exc:  # noqa: BLE001 - cannot tell: each delivery still refuses to ack
        _LOGGER.warning("could not look for failed jobs waiting for review: %s", exc)
        return
    pending = sum(1 for row in rows if row.fields.get(s.REVIEW) == Review.PENDING.value)
    if pending:
        raise ConfigError(
            f"{pending} failed job(s) of {subscription} wait for their failure message "
            "(review: pending), but PUBSUB_WORKER_FAILURE_TOPIC is not set: set it to the "
            "topic they were failed with, so their failure messages go out"
        )


def check_failure_topic(settings: Settings, publisher: pubsub_v1.PublisherClient) -> None:
    """ConfigError when ``FAILURE_TOPIC`` is set but the topic does not exist.

    Found at start-up rather than on the first failing job, which could then
    only be left unacked.
    """
    topic = settings.failure_topic_path
    if topic is None:
        return
    try:
        publisher.get_topic(request={"topic": topic}, timeout=_CHECK_TIMEOUT_S)
    except gexc.NotFound as exc:
        raise ConfigError(
            f"PUBSUB_WORKER_FAILURE_TOPIC={topic!r}: the topic does not exist; create it "
            f"(gcloud pubsub topics create {topic.rsplit('/', 1)[-1]}) or unset the variable"
        ) from exc
    except gexc.PermissionDenied:
        _LOGGER.warning("cannot check that failure topic %s exists (permission denied)", topic)
    except (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError) as exc:
        raise Unreachable(f"Pub/Sub did not answer while checking topic {topic}: {exc}") from exc
