"""Google clients configured for a worker, and the start-up checks that use them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import grpc
from google.api_core import exceptions as gexc
from google.api_core import retry
from google.auth import exceptions as auth_exceptions
from google.cloud import firestore
from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

from pubsub_worker.errors import ConfigError, LimitExceeded, Unreachable
from pubsub_worker.settings import Settings

from . import limits
from .emulator_channel import half_closing

__all__ = [
    "CHANNEL_OPTIONS",
    "Publish",
    "check_firestore",
    "firestore_client",
    "publisher_client",
    "publisher_function",
    "read_subscription",
    "subscriber_client",
]

Publish = Callable[[str, bytes, Mapping[str, str]], "Future[str]"]
"""``publish(topic_path, data, attributes)``: a future of the published message's id."""

# Exactly-once error trailers list every refused ack id; ~80 of them overflow gRPC's
# default 8 KiB metadata limit and break the stream (and once, the lease thread).
# (Keepalive pings are left to the client's production defaults: the emulator answers
# pings every 30 s with GOAWAY "too_many_pings", which drops the streaming pull.)
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_metadata_size", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
)

_CHECK_TIMEOUT_S = 10.0
# Start-up checks retry briefly (an emulator that just started may refuse a moment), then
# give a clear error instead of the client's default of retrying for minutes.
_CHECK_RETRY = retry.Retry(
    initial=0.1,
    maximum=1.0,
    multiplier=2.0,
    timeout=_CHECK_TIMEOUT_S,
    predicate=retry.if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded),
)


NO_CREDENTIALS = (
    "no Google Cloud credentials for {what}: set up Application Default Credentials "
    "(`gcloud auth application-default login`, or the service account of the Cloud Run "
    "service or GKE workload), or point {host} at an emulator ({error})"
)


@contextlib.contextmanager
def _credentials(what: str, host: str) -> Iterator[None]:
    """Turn the client's missing-credentials error into a ``ConfigError`` saying what to do."""
    try:
        yield
    except auth_exceptions.DefaultCredentialsError as exc:
        first = str(exc).split(". ")[0].rstrip(".")
        raise ConfigError(NO_CREDENTIALS.format(what=what, host=host, error=first)) from None


def _emulator(settings: Settings | None, name: str) -> str | None:
    value = getattr(settings, name, None) if settings is not None else None
    return value or os.environ.get(name.upper()) or None


def subscriber_client(settings: Settings | None = None) -> pubsub_v1.SubscriberClient:
    """A subscriber whose channel accepts large exactly-once error trailers.

    On the emulator its streaming pulls end with a half-close: the emulator
    ignores a cancel (:mod:`pubsub_worker._support.emulator_channel`).
    """
    host = _emulator(settings, "pubsub_emulator_host")
    if host:
        # The emulator keeps a cancelled stream taking messages: end each by a half-close.
        channel = half_closing(grpc.insecure_channel(host, options=list(CHANNEL_OPTIONS)))
        return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))

    def make_channel(*args: Any, options: Any = (), **kwargs: Any) -> grpc.Channel:
        merged = dict(options or ())
        merged.update(CHANNEL_OPTIONS)
        return SubscriberGrpcTransport.create_channel(*args, options=list(merged.items()), **kwargs)

    with _credentials("Pub/Sub", "PUBSUB_EMULATOR_HOST"):
        return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=make_channel))


def publisher_client(settings: Settings | None = None) -> pubsub_v1.PublisherClient:
    """A publisher (the emulator is picked up from ``PUBSUB_EMULATOR_HOST``)."""
    del settings
    with _credentials("Pub/Sub", "PUBSUB_EMULATOR_HOST"):
        return pubsub_v1.PublisherClient()


def publisher_function(
    publisher: pubsub_v1.PublisherClient,
) -> Publish:
    """Adapt a publisher to the ``(topic_path, data, attributes) -> Future`` shape.

    Every message is checked against production's limits first
    (:func:`pubsub_worker._support.limits.check_message`): one that breaks them is not
    sent, and the returned future fails with :class:`~pubsub_worker.errors.LimitExceeded`
    (nothing is raised by the call itself), so a caller handles it where it
    handles every other publish error, at ``future.result()``.
    """

    def publish(topic: str, data: bytes, attributes: Mapping[str, str]) -> Future[str]:
        try:
            limits.check_message(data, attributes)
        except LimitExceeded as exc:
            # The emulator would accept most of these and production would not: never send.
            failed: Future[str] = Future()
            failed.set_exception(exc)
            return failed
        return publisher.publish(topic, data, **attributes)  # type: ignore[no-any-return]

    return publish


def firestore_client(settings: Settings) -> firestore.Client:
    """A Firestore client for the project (the emulator via ``FIRESTORE_EMULATOR_HOST``)."""
    with _credentials("Firestore", "FIRESTORE_EMULATOR_HOST"):
        return firestore.Client(project=settings.project_id)


def read_subscription(subscriber: pubsub_v1.SubscriberClient, settings: Settings) -> Any:
    """The subscription, read once (a ``google.pubsub_v1.types.Subscription``).

    What the start-up checks need is on it: ``enable_exactly_once_delivery``,
    ``enable_message_ordering``, its topic and policies. Raises
    :class:`ConfigError` for a missing subscription, and :class:`Unreachable`
    when Pub/Sub does not answer (after retrying for up to 10 s).
    """
    path = settings.subscription_path
    try:
        subscription = subscriber.get_subscription(
            request={"subscription": path}, retry=_CHECK_RETRY, timeout=_CHECK_TIMEOUT_S
        )
    except gexc.NotFound as exc:
        raise ConfigError(
            f"PUBSUB_WORKER_SUBSCRIPTION: subscription {path} does not exist"
        ) from exc
    except (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError) as exc:
        where = _emulator(settings, "pubsub_emulator_host")
        hint = (
            f"the emulator at {where} (PUBSUB_EMULATOR_HOST); is it running? "
            "`python -m emulator up` starts one"
            if where
            else "pubsub.googleapis.com"
        )
        raise Unreachable(f"Pub/Sub did not answer: {hint} ({exc})") from exc
    return subscription


def check_firestore(client: firestore.Client, settings: Settings) -> None:
    """One cheap read, so an unreachable Firestore fails at start-up with a clear error."""
    try:
        client.collection(settings.collection).document("pubsub-worker-start-check").get(
            retry=_CHECK_RETRY, timeout=_CHECK_TIMEOUT_S
        )
    except (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.RetryError) as exc:
        where = _emulator(settings, "firestore_emulator_host")
        hint = (
            f"the emulator at {where} (FIRESTORE_EMULATOR_HOST); is it running?"
            if where
            else "firestore.googleapis.com"
        )
        raise Unreachable(f"Firestore did not answer: {hint} ({exc})") from exc
