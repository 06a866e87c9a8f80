"""A worker stopped on the emulator leaves no stream behind.

The emulator keeps serving a cancelled streaming pull (tests/emulator/
test_emulator_streams.py); the worker's subscriber half-closes its stream
first (:mod:`pubsub_worker._support.emulator_channel`), so the next worker
gets the messages published after the stop at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
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
