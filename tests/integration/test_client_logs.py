"""The stock client's real refused-modack records, provoked on the emulator, become one line.

A message is held by a subscriber without being acked, then nacked from
outside (``modify_ack_deadline`` to 0 with its ack id): the emulator
redelivers it at once, so the held ack id is stale, and the stock client's
lease maintenance, which renews every held id in one request, is refused.
Its lease extension is 10 s here, so it renews every 9 s at the latest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.cloud.pubsub_v1.types import FlowControl

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker._support.client_logs import (
    MODACK_FAILURE_MESSAGE,
    STOCK_LOGGER,
    RefusedModacks,
    is_refused_modack,
)
from pubsub_worker._support.metrics import Counter, Metrics

pytestmark = pytest.mark.emulator

WAIT_S = 60.0
"""Generous: the client's lease maintenance comes within 9 s."""


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Spy(logging.Filter):
    """Sees every record of the logger before the filters after it (lets all through)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


@pytest.fixture
def stock_logger() -> Iterator[tuple[Spy, RefusedModacks, Records, Records]]:
    """The stock logger with a spy, then a fresh filter; handlers on it and on the summary's."""
    stock = logging.getLogger(STOCK_LOGGER)
    summary_logger = logging.getLogger("test.client_logs.real")
    summary_logger.setLevel(logging.INFO)
    spy, refused = Spy(), RefusedModacks(interval_s=3600.0, logger=summary_logger)
    shown, summaries = Records(), Records()
    saved = stock.filters[:]
    stock.filters[:] = [spy, refused]
    stock.addHandler(shown)
    summary_logger.addHandler(summaries)
    try:
        yield spy, refused, shown, summaries
    finally:
        stock.filters[:] = saved
        stock.removeHandler(shown)
        summary_logger.removeHandler(summaries)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.1)


def test_the_real_records_are_dropped_counted_and_summarised(
    publisher: Any,
    subscriber: Any,
    make_subscription: Callable[..., SubscriptionHandle],
    stock_logger: tuple[Spy, RefusedModacks, Records, Records],
) -> None:
    spy, refused, shown, summaries = stock_logger
    metrics = Metrics()
    refused.count_into(metrics)
    handle = make_subscription(exactly_once=True, ack_deadline_seconds=10)
    held: list[Any] = []
    future = subscriber.subscribe(
        handle.subscription_path,
        callback=held.append,  # held, never acked
        flow_control=FlowControl(
            min_duration_per_lease_extension=10, max_duration_per_lease_extension=10
        ),
    )
    try:
        publisher.publish(handle.topic_path, b"held").result()
        wait_for(lambda: len(held) == 1, "the first delivery")
        subscriber.modify_ack_deadline(
            request={
                "subscription": handle.subscription_path,
                "ack_ids": [held[0].ack_id],
                "ack_deadline_seconds": 0,
            }
        )
        wait_for(lambda: len(held) == 2, "the redelivery")
        wait_for(lambda: refused.total >= 1, "a refused lease modack")
    finally:
        future.cancel()
        future.result(timeout=30)

    failures = [r for r in spy.records if r.getMessage() == MODACK_FAILURE_MESSAGE]
    codes = {_status(r) for r in failures}
    assert AcknowledgeStatus.INVALID_ACK_ID in codes  # the stale id itself
    # Every such record the client logged is the one the filter matches ...
    assert failures
    assert all(is_refused_modack(r) for r in failures)
    assert refused.total == len(failures)
    assert metrics.get(Counter.CLIENT_MODACKS_REFUSED) == len(failures)
    # ... and none reached a handler: one summary line instead, at once, without traceback.
    assert not [r for r in shown.records if r.getMessage() == MODACK_FAILURE_MESSAGE]
    assert [r.getMessage().split(" lease")[0] for r in summaries.records] == ["Pub/Sub client: 1"]
    assert summaries.records[0].exc_info is None
    # Everything else the client logged went through untouched.
    others = [r for r in spy.records if r.getMessage() != MODACK_FAILURE_MESSAGE]
    assert len(shown.records) == len(others)


def _status(record: logging.LogRecord) -> AcknowledgeStatus | None:
    error = record.exc_info[1] if record.exc_info else None
    return error.error_code if isinstance(error, AcknowledgeError) else None


def test_run_counts_them_into_the_workers_metrics(
    subscriber: Any,
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Callable[..., Any],
) -> None:
    """``run()`` installs the filter and binds it to the worker's own metrics."""
    release = threading.Event()
    ack_ids: list[str] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        ack_ids.append(message.ack_id)
        release.wait(WAIT_S)

    settings = settings_for(eod_subscription, max_processing_seconds=120)
    with worker(handle, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"x").result()
        wait_for(lambda: len(ack_ids) == 1, "the delivery")
        subscriber.modify_ack_deadline(
            request={
                "subscription": eod_subscription.subscription_path,
                "ack_ids": ack_ids[:1],
                "ack_deadline_seconds": 0,
            }
        )
        wait_for(
            lambda: w.counter(pubsub_worker.Counter.CLIENT_MODACKS_REFUSED) >= 1,
            "a refused lease modack counted by the worker",
        )
        release.set()
