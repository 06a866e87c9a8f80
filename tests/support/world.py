"""The wrapper on the in-memory store, with a fake message and a fake publisher.

The harness of the unit tests of whole deliveries: :class:`World` wraps a
handler on a :class:`FlakyStore` (the in-memory store, failures switched on
per operation) and a :class:`FakePublisher`; a :class:`FakeMessage` records
what the library told Pub/Sub (ack, nack, a deferral, a drop). The ``world``
fixture (registered for tests/unit by its conftest) makes worlds and closes
them after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._job.keys import document_id
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, replay
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores import base as s

__all__ = ["FAILURES", "SUB", "FakeMessage", "FakePublisher", "FlakyStore", "World", "world"]

SUB = "projects/p/subscriptions/jobs"
FAILURES = "projects/p/topics/failures"


class FakeMessage:
    """A Pub/Sub message that records what the library told Pub/Sub."""

    _ids = iter(range(1, 1_000_000))

    def __init__(self, data: bytes = b"payload", **attributes: str) -> None:
        self.data = data
        self.attributes = attributes
        self.message_id = str(next(self._ids))
        self.ack_id = f"ack-{self.message_id}"
        self.publish_time = datetime.now(timezone.utc)
        self.delivery_attempt: int | None = None
        self.exactly_once_enabled = True
        self.opentelemetry_data: object | None = None
        self.actions: list[str] = []

    def ack_with_response(self) -> Future[Any]:
        self.actions.append("ack")
        future: Future[Any] = Future()
        future.set_result(None)
        return future

    def nack(self) -> None:
        self.actions.append("nack")

    def drop(self) -> None:
        self.actions.append("drop")

    def modify_ack_deadline(self, seconds: int) -> None:
        self.actions.append(f"deadline {seconds}")

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(None)
        return future

    @property
    def outcome(self) -> str:
        """``ack``, ``nack``, ``defer`` (a deadline, then a drop) or ``drop``."""
        if self.actions and self.actions[0].startswith("deadline") and self.actions[1:] == ["drop"]:
            return "defer"
        assert len(self.actions) == 1, self.actions
        return self.actions[0]


class FakePublisher:
    """Resolves every publish at once; ``fail`` makes publishes to a topic fail."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []
        self.fail: dict[str, BaseException] = {}

    def publish(self, topic: str, data: bytes, **attributes: str) -> Future[str]:
        future: Future[str] = Future()
        if topic in self.fail:
            future.set_exception(self.fail[topic])
            return future
        self.sent.append((topic, data, attributes))
        future.set_result(str(len(self.sent)))
        return future


class FlakyStore(MemoryJobStore):
    """The in-memory store, with failures switched on per operation."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, BaseException] = {}

    def get(self, doc_id: str) -> s.Snapshot | None:
        if "get" in self.fail:
            raise self.fail["get"]
        return super().get(doc_id)

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> s.Version:
        if "create" in self.fail:
            raise self.fail["create"]
        return super().create(doc_id, fields)

    def update(self, doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        if "update" in self.fail:
            raise self.fail["update"]
        return super().update(doc_id, changes, expected=expected)


class World:
    """A wrapper around ``handler`` on a fresh store, publisher and settings."""

    def __init__(
        self,
        handler: Callable[..., Any],
        store: FlakyStore | None = None,
        hooks: Hooks | None = None,
        **settings: Any,
    ) -> None:
        self.store = store or FlakyStore()
        self.publisher = FakePublisher()
        self.hooks = hooks if hooks is not None else Hooks()
        options = {
            "subscription": SUB,
            "key_attribute": "op",
            "lease_seconds": 10,
            "max_attempts": 3,
            "failure_topic": FAILURES,
            **settings,
        }
        self.wrapped = pubsub_worker.exactly_once(
            handler,
            settings=pubsub_worker.Settings(**options),
            store=self.store,
            publisher=self.publisher,
            hooks=self.hooks,
        )
        self.wrapped.start(check_subscription=False, conclude_off_thread=True)

    def deliver(self, message: FakeMessage) -> str:
        self.wrapped(message)
        assert self.wrapped.wait_concluded(10)  # a returned handler concludes on the completer
        return message.outcome

    def record(self, key: str = "k") -> dict[str, Any]:
        snap = self.store.get(document_id(SUB, key))
        assert snap is not None
        return snap.fields

    def reviews(self) -> list[dict[str, str]]:
        return [attrs for topic, _, attrs in self.publisher.sent if topic == FAILURES]

    def replay(self, key: str = "k") -> FakeMessage:
        """``pubsub-worker jobs replay`` of the failed job ``key``: the message it republished."""
        republished: list[FakeMessage] = []

        def publish(topic: str, data: bytes, attributes: Mapping[str, str]) -> Future[str]:
            republished.append(FakeMessage(data, **attributes))
            future: Future[str] = Future()
            future.set_result("replayed")
            return future

        doc_id = document_id(SUB, key)
        snap = self.store.get(doc_id)
        assert snap is not None
        (result,) = replay(
            self.store,
            [FailedJob(doc_id, s.JobRecord.parse(snap.fields))],
            topic="projects/p/topics/jobs",
            publish=publish,
            key_attribute="op",
        )
        assert result.kind is ReplayOutcome.REPLAYED, result
        (message,) = republished
        return message

    def close(self) -> None:
        self.wrapped.close()


@pytest.fixture
def world() -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(handler: Callable[..., Any], **settings: Any) -> World:
        made.append(World(handler, **settings))
        return made[-1]

    yield make
    for w in made:
        w.close()
