"""A worker stopped on the emulator leaves no stream behind; an idle worker says so.

The emulator keeps serving a cancelled streaming pull (tests/emulator/
test_emulator_streams.py); the worker's subscriber half-closes its stream
first (:mod:`pubsub_worker._support.emulator_channel`), so the next worker
gets the messages published after the stop at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker._support import idle
from tests.emulator.test_emulator_streams import PROBES, available_after_publishing

pytestmark = pytest.mark.emulator


def test_a_stopped_worker_leaves_no_stream_that_takes_messages(
    publisher: Any,
    subscriber: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Callable[..., Any],
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)

    with worker(handle, settings_for(eod_subscription)) as w:
        publisher.publish(eod_subscription.topic_path, b"x").result()
        w.wait_for(lambda: w.counter(pubsub_worker.Counter.COMPLETED) == 1)
    # Stopped as on SIGTERM: everything published now stays for the next worker.
    assert available_after_publishing(publisher, subscriber, eod_subscription) == PROBES


def test_an_idle_worker_logs_a_line_per_interval(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Callable[..., Any],
) -> None:
    monkeypatch.setattr(idle, "IDLE_INTERVAL_S", 0.5)
    caplog.set_level(logging.INFO, logger="pubsub_worker")
    sub = eod_subscription.subscription_path

    def idle_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("idle: ")]

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)

    with worker(handle, settings_for(eod_subscription)) as w:
        w.wait_for(lambda: len(idle_lines()) >= 2)
        first = idle_lines()[0]
        assert first.startswith(f"idle: no message from {sub} for ")
        assert "; 0 in flight; no message since the start at " in first
        # Against the emulator the line says what may hold messages back, and the remedy.
        assert f"`python -m emulator end-streams {sub}`" in first

        publisher.publish(eod_subscription.topic_path, b"x").result()
        w.wait_for(lambda: w.counter(pubsub_worker.Counter.COMPLETED) == 1)
        seen = len(idle_lines())
        w.wait_for(lambda: any("; last message at " in line for line in idle_lines()[seen:]))
    stopped = len(idle_lines())
    time.sleep(1.5)  # three intervals: a stopped worker's reporter is gone
    assert len(idle_lines()) == stopped
