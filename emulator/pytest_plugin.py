"""pytest plugin: the real emulators once per session, fresh resources per test.

Registered through the ``pytest11`` entry point of the package. Fixtures:

=========================  =========  ============================================
fixture                    scope      value
=========================  =========  ============================================
``emulators``              session    :class:`~emulator.Emulators`, env exported
``publisher``              session    ``PublisherClient`` checked against limits
``subscriber``             session    ``google.cloud.pubsub_v1.SubscriberClient``
``firestore_client``       session    ``google.cloud.firestore.Client``
``make_subscription``      function   factory -> :class:`~emulator.SubscriptionHandle`
``eod_subscription``       function   exactly-once, 10 s ack deadline handle
``firestore_collection``   function   a unique collection id (``str``)
``clean_firestore``        function   empties the project's Firestore first
=========================  =========  ============================================

When the emulators cannot start, tests that need them are skipped, except
when the ``CI`` environment variable is truthy: then they fail (a CI run
that silently skips its integration tests proves nothing). Tests that use
the ``emulators`` fixture, directly or not, get the ``emulator`` marker, so
``-m "not emulator"`` deselects them.

Heavy imports happen inside the fixtures: loading the plugin costs nothing
for test runs that do not use it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pytest

from emulator.bootstrap import (
    SubscriptionHandle,
    create_subscription,
    delete_subscription,
    emulator_channel,
)
from emulator.emulators import Emulators, start_emulators
from emulator.errors import EmulatorError
from emulator.names import unique_id
from emulator.topology import PushSpec, RetrySpec

__all__ = [
    "MakeSubscription",
    "clean_firestore",
    "emulators",
    "eod_subscription",
    "firestore_client",
    "firestore_collection",
    "make_subscription",
    "publisher",
    "running_in_ci",
    "subscriber",
]

SESSION_PROJECT = "pubsub-worker-test"
"""Project id the session's emulators are used with."""

_FALSE = {"", "0", "false", "no", "off"}


def running_in_ci() -> bool:
    """Return whether the ``CI`` environment variable is set to a true value."""
    return os.environ.get("CI", "").strip().lower() not in _FALSE


class MakeSubscription(Protocol):
    """Signature of the ``make_subscription`` factory fixture."""

    def __call__(
        self,
        *,
        exactly_once: bool = True,
        ack_deadline_seconds: int = 10,
        max_delivery_attempts: int | None = None,
        retry: RetrySpec | None = None,
        ordering: bool = False,
        push: PushSpec | None = None,
        prefix: str = "t",
    ) -> SubscriptionHandle: ...


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker, for projects that use the plugin with --strict-markers."""
    config.addinivalue_line(
        "markers", "emulator: needs the real local Pub/Sub and Firestore emulators"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that depends on the ``emulators`` fixture with ``emulator``."""
    for item in items:
        if "emulators" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.emulator)


def _prune_logs(folder: Path, max_age_s: float = 24 * 3600) -> None:
    """Delete emulator logs older than ``max_age_s`` (other sessions may be writing)."""
    cutoff = time.time() - max_age_s
    for log in folder.glob("*.log"):
        with contextlib.suppress(OSError):
            if log.stat().st_mtime < cutoff:
                log.unlink()


@pytest.fixture(scope="session")
def emulators(request: pytest.FixtureRequest) -> Iterator[Emulators]:
    """Start both emulators once per session; export their environment variables.

    Skips (locally) or fails (``CI`` set) every dependent test when they
    cannot start. Logs go to ``<rootdir>/.emulator/logs``; logs older than a
    day are deleted there.
    """
    log_dir = Path(request.config.rootpath, ".emulator", "logs")
    _prune_logs(log_dir)
    try:
        emu = start_emulators(SESSION_PROJECT, log_dir=log_dir)
    except (EmulatorError, ImportError) as exc:
        message = f"emulators unavailable: {exc}"
        if running_in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    previous = emu.export_env()
    try:
        yield emu
    finally:
        emu.stop()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _LimitedPublisher:
    """A ``PublisherClient`` whose ``publish`` refuses what production's Pub/Sub rejects.

    The emulator accepts 101 attributes, oversized or empty keys and keys
    starting with ``goog``; production does not. Checking here means a test
    cannot pass by publishing a message production would refuse. Everything
    but ``publish`` is the client's own.
    """

    # Keywords of PublisherClient.publish that are not message attributes.
    _OPTIONS = frozenset({"ordering_key", "retry", "timeout"})

    def __init__(self, client: Any, check: Callable[[bytes, Mapping[str, str]], None]) -> None:
        self._client = client
        self._check = check

    def publish(self, topic: str, data: bytes, **kwargs: Any) -> Any:
        """Publish like the client; raise ``LimitExceeded`` for a message over the limits."""
        attributes = {k: v for k, v in kwargs.items() if k not in self._OPTIONS}
        # Values of the wrong type are left to the client, which raises its own TypeError.
        if isinstance(data, bytes) and all(isinstance(v, str) for v in attributes.values()):
            self._check(data, attributes)
        return self._client.publish(topic, data, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture(scope="session")
def publisher(emulators: Emulators) -> Iterator[Any]:
    """A ``google.cloud.pubsub_v1.PublisherClient`` bound to the emulator.

    Its ``publish(topic, data, **attrs)`` raises
    :class:`pubsub_worker.errors.LimitExceeded`, before sending, for a message
    that breaks production's limits (:mod:`pubsub_worker._support.limits`), which the
    emulator would accept.
    """
    import google.cloud.pubsub_v1 as pubsub_v1  # noqa: PLC0415

    from pubsub_worker._support import limits  # noqa: PLC0415

    client: Any = pubsub_v1.PublisherClient()
    try:
        yield _LimitedPublisher(client, limits.check_message)
    finally:
        client.stop()
        client.transport.close()


@pytest.fixture(scope="session")
def subscriber(emulators: Emulators) -> Iterator[Any]:
    """A ``google.cloud.pubsub_v1.SubscriberClient`` bound to the emulator.

    Its channel accepts large gRPC metadata, which exactly-once ack error
    trailers need once many ack ids fail in one request.
    """
    import google.cloud.pubsub_v1 as pubsub_v1  # noqa: PLC0415
    from google.pubsub_v1.services.subscriber.transports.grpc import (  # noqa: PLC0415
        SubscriberGrpcTransport,
    )

    assert emulators.pubsub_host is not None
    channel = emulator_channel(emulators.pubsub_host)
    client: Any = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def firestore_client(emulators: Emulators) -> Iterator[Any]:
    """A ``google.cloud.firestore.Client`` bound to the emulator and its project."""
    from google.cloud import firestore  # noqa: PLC0415

    client: Any = firestore.Client(project=emulators.project)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def make_subscription(
    emulators: Emulators, publisher: Any, subscriber: Any
) -> Iterator[MakeSubscription]:
    """Factory for fresh topic + subscription pairs; deleted after the test.

    Call with keyword options ``exactly_once`` (default True),
    ``ack_deadline_seconds`` (10), ``max_delivery_attempts`` (None: no
    dead-letter topic), ``retry`` (:class:`~emulator.RetrySpec` or None),
    ``ordering`` (False: no message ordering), ``push`` (:class:`~emulator.PushSpec`:
    a push subscription, with ``exactly_once=False``) and ``prefix``. Returns a
    :class:`~emulator.SubscriptionHandle`.
    """
    made: list[SubscriptionHandle] = []

    def make(**options: Any) -> SubscriptionHandle:
        handle = create_subscription(
            project=emulators.project, publisher=publisher, subscriber=subscriber, **options
        )
        made.append(handle)
        return handle

    yield make
    for handle in made:
        delete_subscription(handle, publisher=publisher, subscriber=subscriber)


@pytest.fixture
def eod_subscription(make_subscription: MakeSubscription) -> SubscriptionHandle:
    """A fresh topic with an exactly-once subscription, 10 s ack deadline."""
    return make_subscription(exactly_once=True, ack_deadline_seconds=10)


@pytest.fixture
def firestore_collection() -> str:
    """A collection id no other test uses."""
    return unique_id("col")


@pytest.fixture
def clean_firestore(emulators: Emulators) -> Emulators:
    """Delete every document of the session project before the test."""
    emulators.reset_firestore()
    return emulators
