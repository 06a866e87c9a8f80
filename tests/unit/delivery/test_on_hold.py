"""Held messages released as far as the load allows, on a stock manager faked down to its parts.

The fake keeps the stock client's own ``MessagesOnHold`` and releases through the
same rule as ``StreamingPullManager._maybe_release_messages`` (one message per free
slot of ``max_messages``); with a real subscriber on the emulator, in the state the
client's race leaves, ``tests/integration/test_on_hold.py``.
"""

from __future__ import annotations

import gc
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from google.cloud.pubsub_v1.subscriber._protocol.messages_on_hold import MessagesOnHold

from pubsub_worker._delivery.on_hold import OnHold, release_held
from pubsub_worker._support.metrics import Metrics

SUB = "projects/p/subscriptions/s"


class _Manager:
    """What :mod:`~pubsub_worker._delivery.on_hold` reads of a streaming pull manager."""

    def __init__(self, *, max_messages: int, in_flight: int = 0, held: int = 0) -> None:
        self._subscription = SUB
        self._pause_resume_lock = threading.Lock()
        self._messages_on_hold = MessagesOnHold()
        self._consumer: object | None = object()
        self._scheduler: object | None = object()
        self._leaser: object | None = object()
        self.max_messages = max_messages
        self.in_flight = in_flight
        self.paused = False
        self.pause_checks = 0
        for n in range(held):
            self._messages_on_hold.put(_held(f"a{n}"))

    @property
    def load(self) -> float:
        return self.in_flight / self.max_messages

    def _maybe_release_messages(self) -> None:
        assert self._pause_resume_lock.locked()  # the client's rule: called under its lock
        while self.load < 1.0 and self._messages_on_hold.get() is not None:
            self.in_flight += 1

    def maybe_pause_consumer(self) -> None:
        self.pause_checks += 1
        self.paused = self.load >= 1.0

    def _exactly_once_delivery_enabled(self) -> bool:
        return True


def _held(ack_id: str, ordering_key: str = "") -> Any:
    """A message as the client puts it on hold (the parts ``MessagesOnHold`` reads)."""
    return SimpleNamespace(ack_id=ack_id, ordering_key=ordering_key, opentelemetry_data=None)


class _Message:
    """A received message: the client builds it with its manager's exactly-once query."""

    def __init__(self, manager: Any) -> None:
        self._exactly_once_delivery_enabled_func = manager._exactly_once_delivery_enabled


def test_releases_as_many_as_the_load_allows_then_the_client_pauses() -> None:
    manager = _Manager(max_messages=3, in_flight=1, held=5)
    assert release_held(manager) == 2
    assert manager._messages_on_hold.size == 3
    assert manager.paused  # full again: the client's own pause, as after its release
    assert release_held(manager) == 0  # full: the settlements to come release the rest
    manager.in_flight = 0
    assert release_held(manager) == 3
    assert manager._messages_on_hold.size == 0


@pytest.mark.parametrize(
    "manager",
    [
        _Manager(max_messages=3, held=0),
        _Manager(max_messages=3, in_flight=3, held=2),
        SimpleNamespace(),  # another client's internals: left alone
    ],
    ids=["nothing-held", "full", "unknown-client"],
)
def test_nothing_to_release(manager: Any) -> None:
    assert release_held(manager) == 0


@pytest.mark.parametrize("part", ["_consumer", "_scheduler", "_leaser"])
def test_a_closing_or_closed_stream_is_left_alone(part: str) -> None:
    manager = _Manager(max_messages=3, held=2)
    setattr(manager, part, None)  # the client's shutdown: its consumer first, then the rest
    assert release_held(manager) == 0
    assert manager._messages_on_hold.size == 2
    assert manager.pause_checks == 0


def test_an_ordering_key_in_flight_keeps_its_next_message_on_hold() -> None:
    manager = _Manager(max_messages=10)
    for n in range(3):
        manager._messages_on_hold.put(_held(f"k{n}", ordering_key="k"))
    assert release_held(manager) == 1  # the key's first; the others wait for its ack
    assert manager._messages_on_hold.size == 2


def test_the_managers_of_received_messages_are_released_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    one, two = _Manager(max_messages=2, held=3), _Manager(max_messages=1, held=1)
    metrics = Metrics()
    on_hold = OnHold(metrics)
    for manager in (one, one, two, one):
        on_hold.note(_Message(manager))
    on_hold.note(SimpleNamespace())  # a push delivery, a test's message: no manager
    with caplog.at_level(logging.INFO, logger="pubsub_worker._delivery.on_hold"):
        assert on_hold.release() == 3
    assert metrics.snapshot()["held_released"] == 3
    assert on_hold.release() == 0  # both full now
    assert metrics.snapshot()["held_released"] == 3
    assert sorted(r.getMessage() for r in caplog.records) == [  # the managers in any order
        f"released {n} message(s) the Pub/Sub client held with its stream running "
        f"(subscription {SUB}): it releases held messages only while paused"
        for n in (1, 2)
    ]


def test_a_manager_gone_is_forgotten() -> None:
    on_hold = OnHold()
    manager = _Manager(max_messages=1, held=1)
    on_hold.note(_Message(manager))
    del manager
    gc.collect()
    assert on_hold.release() == 0


def test_a_release_that_raises_is_logged_once_and_not_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager = _Manager(max_messages=2, held=2)
    calls = []

    def broken() -> None:
        calls.append(1)
        raise AttributeError("'StreamingPullManager' object has no attribute '_leaser'")

    manager._maybe_release_messages = broken  # type: ignore[method-assign]
    on_hold = OnHold()
    on_hold.note(_Message(manager))
    with caplog.at_level(logging.ERROR, logger="pubsub_worker._delivery.on_hold"):
        assert on_hold.release() == 0
        assert on_hold.release() == 0
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "releasing the Pub/Sub client's held messages failed; left to the client from now "
        "on (it releases them with its next pull response)"
    ]
    assert caplog.records[0].exc_info is not None
