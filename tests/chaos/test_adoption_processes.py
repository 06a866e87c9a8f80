"""Adoption paths in real worker processes: an existing callback, wrapped, killed at a window.

The workers are ``python -m tests.support.adoption_worker`` (handler shapes
``tests.support.worker`` does not have), run by :func:`pubsub_worker.run` and
by the user's own ``subscriber.subscribe(path, callback=exactly_once(callback))``.
Effects, deliveries and acks are counted exactly, as in the other crash-window
tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.chaos.conftest import LEASE_S
from tests.support.observe import (
    acks,
    assert_not_redelivered,
    collect,
    deliveries,
    end_stale_streams,
    job_document,
    runs,
)
from tests.support.processes import Effects, Worker, start_worker, stop_all

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

QUIET_S = 3.0
"""How long the output subscription is pulled once every worker is gone."""


@pytest.fixture
def adoption_workers(tmp_path: Path) -> Iterator[Any]:
    """``adoption_workers(env, name)`` starts an adoption worker; all are killed at the end."""
    started: list[Worker] = []

    def start(env: dict[str, str], name: str = "worker") -> Worker:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        worker = start_worker(env, log_path, name, module="tests.support.adoption_worker")
        started.append(worker)
        return worker

    yield start
    stop_all(started)


@pytest.mark.parametrize("runner", ["run", "subscribe"])
def test_async_callback_publishing_then_acking_killed_before_its_ack_publishes_once(
    runner: str,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    adoption_workers: Any,
) -> None:
    """Crash window: SIGKILL after the completion is durable, before the ack.

    The callback is an existing ``async def callback(message)`` that calls
    ``message.job.publish(topic, data)`` outside any step, then
    ``message.ack()``. The first worker dies between the completion and the
    ack; the redelivery goes to a second worker, which acks it without
    running the callback. The output was published exactly once (counted on
    a subscription of the output topic), the callback ran once, the job is
    completed once, and nothing comes back.
    """
    out = make_subscription(exactly_once=False)
    sub_path = eod_subscription.subscription_path
    env = {
        **worker_env,
        "ADOPTION_SCENARIO": "async_publish_ack",
        "ADOPTION_RUNNER": runner,
        "CHAOS_OUTPUT_TOPIC": out.topic_path,
    }
    first = adoption_workers({**env, "CHAOS_KILL_AT": "before_ack"}, "first")
    message_id = publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    first.process.wait(timeout=60)  # it killed itself after the completion, before the ack
    assert effects.count("killed") == 1
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)

    end_stale_streams(subscriber, sub_path)
    second = adoption_workers(env, "second")
    second.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=60)
    second.kill()

    outputs = collect(subscriber, out.subscription_path, until=time.monotonic() + QUIET_S)
    assert [m.data for m in outputs] == [b"output:payload"]
    assert outputs[0].attributes["effect_key"].startswith("op-1:")
    assert runs(effects, "publish") == [(first.pid, 1)]
    assert (deliveries(first, message_id), deliveries(second, message_id)) == (1, 1)
    assert acks(first, message_id) == []
    assert acks(second, message_id) == ["SUCCESS"]
    assert "completed (attempt" not in second.log()
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert [entry["sent"] for entry in (doc.get("outbox") or {}).values()] == [True]
    assert_not_redelivered(subscriber, sub_path, lease_s=LEASE_S)
