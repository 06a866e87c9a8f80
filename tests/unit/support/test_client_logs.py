"""The stock client's refused-modack tracebacks: dropped, counted, one summary line per interval.

The records are built exactly as the stock client's ``_send_lease_modacks``
logs them (``_LOGGER.warning(MESSAGE, exc_info=True)`` inside ``except
AcknowledgeError``); tests/integration/test_client_logs.py provokes the real
ones on the emulator.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterator

import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from pubsub_worker._support import client_logs
from pubsub_worker._support.client_logs import (
    MODACK_FAILURE_MESSAGE,
    STOCK_LOGGER,
    RefusedModacks,
    is_refused_modack,
)
from pubsub_worker._support.logs import configure
from pubsub_worker._support.metrics import Counter, Metrics

# The info of the valid ids of a request the emulator refused (as captured from it).
BATCH_REFUSED_INFO = (
    'code: 3\ndetails {\n  type_url: "type.googleapis.com/google.rpc.ErrorInfo"\n'
    '  value: "\\n\\032EXACTLY_ONCE_ACKID_FAILURE\\022\\025pubsub.googleapis.com..."\n}\n'
)


def stock_record(
    error: BaseException | None,
    *,
    name: str = STOCK_LOGGER,
    msg: str = MODACK_FAILURE_MESSAGE,
    level: int = logging.WARNING,
) -> logging.LogRecord:
    """The record ``logging.getLogger(name).warning(msg, exc_info=True)`` makes in ``except``."""
    exc_info = None
    if error is not None:
        try:
            raise error
        except BaseException:
            exc_info = sys.exc_info()
    return logging.getLogger(name).makeRecord(
        name, level, "streaming_pull_manager.py", 1199, msg, (), exc_info, "_send_lease_modacks"
    )


def invalid_ack_id() -> logging.LogRecord:
    return stock_record(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, info=None))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("test.client_logs.summary")
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
def refused(lines: Lines) -> RefusedModacks:
    return RefusedModacks(
        interval_s=60.0, clock=Clock(), logger=logging.getLogger("test.client_logs.summary")
    )


def test_the_stock_clients_invalid_ack_id_record_is_recognised() -> None:
    assert is_refused_modack(invalid_ack_id())
    # The valid ids of a request the emulator refused because of an invalid one.
    assert is_refused_modack(
        stock_record(AcknowledgeError(AcknowledgeStatus.OTHER, BATCH_REFUSED_INFO))
    )


@pytest.mark.parametrize(
    "record",
    [
        # The same failure for another reason is an error a person must see.
        stock_record(AcknowledgeError(AcknowledgeStatus.PERMISSION_DENIED, info=None)),
        stock_record(AcknowledgeError(AcknowledgeStatus.FAILED_PRECONDITION, info=None)),
        stock_record(AcknowledgeError(AcknowledgeStatus.OTHER, "UNAVAILABLE: connection reset")),
        stock_record(AcknowledgeError(AcknowledgeStatus.OTHER, None)),
        # Not an AcknowledgeError, or no exception at all.
        stock_record(ValueError("Code in Status proto doesn't match status code")),
        stock_record(None),
        # Another message of that logger, with or without the same exception.
        stock_record(
            AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, info=None),
            msg="Top-level exception occurred in callback while processing a message",
        ),
        # The same text from another logger.
        stock_record(
            AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, info=None),
            name="google.cloud.pubsub_v1.subscriber._protocol.leaser",
        ),
    ],
    ids=[
        "permission-denied",
        "failed-precondition",
        "other-unavailable",
        "other-no-info",
        "value-error",
        "no-exception",
        "other-message",
        "other-logger",
    ],
)
def test_every_other_record_passes_untouched(
    refused: RefusedModacks, lines: Lines, record: logging.LogRecord
) -> None:
    before = record.__dict__.copy()
    assert not is_refused_modack(record)
    assert refused.filter(record) is True
    assert record.__dict__ == before
    assert refused.total == 0
    assert lines.messages == []


def test_a_record_with_arguments_is_not_that_record(refused: RefusedModacks) -> None:
    record = invalid_ack_id()
    record.args = ("x",)
    assert refused.filter(record) is True


def test_refused_modacks_are_dropped_and_counted_into_the_workers_metrics(
    refused: RefusedModacks,
) -> None:
    metrics = Metrics()
    refused.count_into(metrics)
    for _ in range(7):
        assert refused.filter(invalid_ack_id()) is False
    assert refused.total == 7
    assert metrics.get(Counter.CLIENT_MODACKS_REFUSED) == 7
    assert metrics.snapshot()["client_modacks_refused"] == 7


def test_the_metrics_are_held_weakly(refused: RefusedModacks) -> None:
    metrics = Metrics()
    refused.count_into(metrics)
    del metrics
    gc.collect()
    assert refused.filter(invalid_ack_id()) is False  # counted nowhere else, no error
    assert refused.total == 1


def test_one_line_at_once_then_one_per_interval_with_the_count(lines: Lines) -> None:
    clock = Clock()
    refused = RefusedModacks(
        interval_s=60.0, clock=clock, logger=logging.getLogger("test.client_logs.summary")
    )
    refused.filter(invalid_ack_id())
    assert len(lines.messages) == 1
    assert lines.messages[0].startswith("Pub/Sub client: 1 lease renewal(s) refused")
    assert "at most one line per 60 s" in lines.messages[0]

    for _ in range(99):  # within the interval: counted, not shown
        clock.now += 0.5
        refused.filter(invalid_ack_id())
    assert len(lines.messages) == 1

    clock.now += 60.0
    refused.filter(invalid_ack_id())  # the first one after the interval shows its count
    assert len(lines.messages) == 2
    assert lines.messages[1].startswith("Pub/Sub client: 100 lease renewal(s) refused")

    clock.now += 1.0
    refused.filter(invalid_ack_id())
    refused.filter(invalid_ack_id())
    assert len(lines.messages) == 2
    refused.flush()  # when the worker stops: what is left
    assert lines.messages[2].startswith("Pub/Sub client: 2 lease renewal(s) refused")
    refused.flush()  # nothing left: no line
    assert len(lines.messages) == 3
    assert refused.total == 103
    assert {record.levelno for record in lines.records} == {logging.INFO}
    assert all(record.exc_info is None for record in lines.records)


def test_installed_on_the_stock_logger_once_and_removed(lines: Lines) -> None:
    stock = logging.getLogger(STOCK_LOGGER)
    seen = Lines()
    stock.addHandler(seen)
    client_logs.uninstall()
    try:
        first = client_logs.install()
        metrics = Metrics()
        assert client_logs.install(metrics) is first  # idempotent; the metrics are bound
        assert stock.filters.count(first) == 1
        stock.warning(MODACK_FAILURE_MESSAGE, exc_info=_error(AcknowledgeStatus.INVALID_ACK_ID))
        stock.warning(MODACK_FAILURE_MESSAGE, exc_info=_error(AcknowledgeStatus.PERMISSION_DENIED))
        assert [_status(r) for r in seen.records] == [AcknowledgeStatus.PERMISSION_DENIED]
        assert metrics.get(Counter.CLIENT_MODACKS_REFUSED) == 1
        client_logs.uninstall()
        assert first not in stock.filters
        assert client_logs.installed() is None
        stock.warning(MODACK_FAILURE_MESSAGE, exc_info=_error(AcknowledgeStatus.INVALID_ACK_ID))
        assert len(seen.records) == 2  # shown in full again
    finally:
        stock.removeHandler(seen)
        client_logs.uninstall()


def test_the_worker_logging_set_up_installs_it() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    client_logs.uninstall()
    try:
        configure("text")
        installed = client_logs.installed()
        assert installed is not None
        assert installed in logging.getLogger(STOCK_LOGGER).filters
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        client_logs.uninstall()


def _status(record: logging.LogRecord) -> AcknowledgeStatus | None:
    error = record.exc_info[1] if record.exc_info else None
    return error.error_code if isinstance(error, AcknowledgeError) else None


def _error(status: AcknowledgeStatus) -> AcknowledgeError:
    return AcknowledgeError(status, info=None)
