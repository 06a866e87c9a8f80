"""What a handler may be: checked when it is wrapped or served, never per message."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker.errors import ConfigError, InvalidHandler
from pubsub_worker.push import PushDeliveries
from tests.support.world import FakeMessage, World


class Callback:
    def __call__(self, message: Any) -> None:
        message.ack()


class JobStyle:
    def handle(self, message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)


def two(message: Any, job: Any) -> None: ...


async def async_two(message: Any, job: Any) -> None: ...


def defaulted(message: Any, job: Any = None, extra: int = 1) -> None: ...


@pytest.mark.parametrize(
    "handler",
    [
        lambda message: message.ack(),
        two,
        async_two,
        Callback(),
        JobStyle().handle,
        defaulted,
        functools.partial(defaulted, extra=2),
        print,  # a builtin without a signature: taken as callback(message)
    ],
)
def test_what_a_handler_may_be(handler: Any) -> None:
    pubsub_worker.exactly_once(handler)
    PushDeliveries(handler)


def _nothing() -> None: ...


def _three(message: Any, job: Any, more: Any) -> None: ...


def _keyword(message: Any, *, needed: int) -> None: ...


def _generator(message: Any) -> Iterator[None]:
    yield None


async def _async_generator(message: Any) -> AsyncIterator[None]:
    yield None


@pytest.mark.parametrize(
    ("handler", "why"),
    [
        ("tests.handlers:handle", "must be callable"),
        (42, "must be callable"),
        (Callback, "is a class"),
        (_nothing, "takes no argument"),
        (_three, "needs 3 arguments"),
        (_keyword, r"keyword argument\(s\) needed"),
        (_generator, "generator function"),
        (_async_generator, "generator function"),
    ],
)
def test_what_cannot_be_a_handler_is_refused_by_both_doors_naming_why(
    handler: Any, why: str
) -> None:
    for door in (pubsub_worker.exactly_once, PushDeliveries):
        with pytest.raises(InvalidHandler, match=why) as caught:
            door(handler)
        assert isinstance(caught.value, ConfigError)  # the CLI's one line, exit 2
        assert isinstance(caught.value, TypeError)


def test_a_wrapped_handler_is_unwrapped_with_its_options() -> None:
    """``@exactly_once(hooks=...)`` served by the push door: the handler, and its hooks."""
    hooks = pubsub_worker.Hooks()
    wrapped = pubsub_worker.exactly_once(two, hooks=hooks)
    deliveries = PushDeliveries(wrapped)
    assert deliveries.engine.call.handler is two
    assert deliveries.engine.options.get("hooks") is hooks
    assert PushDeliveries(pubsub_worker.exactly_once(wrapped)).engine.call.handler is two


def test_a_handler_s_exception_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        raise ValueError("the payload has no price")

    w = World(handle)
    try:
        caplog.set_level(logging.INFO, logger="pubsub_worker")
        assert w.deliver(FakeMessage(op="k")) == "nack"
    finally:
        w.close()
    (record,) = [r for r in caplog.records if "the payload has no price" in r.getMessage()]
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError
    assert "in handle" in caplog.text  # the traceback's frame of the handler
