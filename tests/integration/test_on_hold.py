"""Messages the stock client holds with its stream running are released, on the emulators.

google-cloud-pubsub releases the messages it holds beyond flow control only
while its stream is paused; a settlement that lands between its release and
its pause leaves the stream running with messages on hold, and nothing
releases them until another pull response comes
(:mod:`pubsub_worker._delivery.on_hold`). The race itself is a few
microseconds wide, so the test makes the state it leaves: the first of a
backlog running (flow control one message), the others on hold, the stream
resumed. The stock client alone leaves them there (the control case, which
shows the state was made); the wrapper's lease keeper releases them on its
next pass, and every message is done once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker._delivery.acks import manager_of
from pubsub_worker._delivery.on_hold import OnHold, release_held

from .test_adoption_paths import Recorder, Tally, consuming, lease_flow, publish_keys, wait_until

pytestmark = pytest.mark.emulator

_STOCK_WAIT_S = 4.0
"""How long the control case watches the held messages stay held (the keeper passes every ~1 s)."""


@pytest.mark.parametrize("released", [True, False], ids=["keeper-releases", "stock-alone"])
def test_messages_held_with_the_stream_running_are_released(
    released: bool,
    monkeypatch: pytest.MonkeyPatch,
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> None:
    settings = settings_for(eod_subscription, key_attribute="op")
    if not released:
        monkeypatch.setattr(OnHold, "release", lambda self: 0)
    hooks, work = Recorder(), Tally()
    first_running, go = threading.Event(), threading.Event()
    managers: list[Any] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        if not managers:
            managers.append(manager_of(message))
            first_running.set()
            assert go.wait(30), "the test never let the first message go on"
        job.step("work", lambda: work.add(job.key))

    wrapped = pubsub_worker.exactly_once(handle, settings=settings, hooks=hooks)
    keys = [f"job-{n}" for n in range(5)]
    ids = publish_keys(publisher, eod_subscription.topic_path, keys)  # one pull response
    one_at_a_time = lease_flow(settings, max_messages=1)
    with consuming(wrapped, settings, "subscribe", flow_control=one_at_a_time):
        assert first_running.wait(30), hooks.snapshot()
        manager = managers[0]
        assert wait_until(lambda: manager._messages_on_hold.size == len(keys) - 1)
        assert wait_until(lambda: manager._consumer.is_paused)  # the stock client's own pause
        with manager._pause_resume_lock:  # what the race leaves: the stream never paused
            manager._consumer.resume()
        go.set()
        if released:
            assert wait_until(lambda: hooks.answered(ids)), hooks.snapshot()
            # The keeper's pass fills flow control's one slot and pauses the stream, as the
            # client's own release does; from then on each settlement releases the next.
            assert wrapped.metrics.snapshot()["held_released"] == 1
        else:
            assert wait_until(lambda: answered(hooks, ids) == 1), hooks.snapshot()
            time.sleep(_STOCK_WAIT_S)
            assert manager._messages_on_hold.size == len(keys) - 1, hooks.snapshot()
            assert answered(hooks, ids) == 1, hooks.snapshot()
            assert wrapped.metrics.snapshot()["held_released"] == 0
            assert release_held(manager) == 1  # flow control's one slot; then the stock pause
            assert wait_until(lambda: hooks.answered(ids)), hooks.snapshot()

    assert work.as_dict() == dict.fromkeys(keys, 1)
    assert all(count == 1 for count in hooks.deliveries.values()), hooks.snapshot()


def answered(hooks: Recorder, ids: list[str]) -> int:
    """How many of ``ids`` had an ack answered."""
    return sum(hooks.answered([message_id]) for message_id in ids)
