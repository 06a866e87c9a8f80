"""What the stock Pub/Sub client logs, made readable: refused lease renewals, summarised.

With exactly-once delivery the stock client's lease maintenance renews every
message it holds in one modack request, including messages whose ack is sent
but not answered yet, or that were redelivered meanwhile. Pub/Sub refuses
such an id (``INVALID_ACK_ID``), and the emulator refuses the whole request
when one id is invalid: every other id of it comes back ``OTHER`` with the
``EXACTLY_ONCE_ACKID_FAILURE`` status. The client logs each refused id as a
warning with a full traceback::

    logger   google.cloud.pubsub_v1.subscriber._protocol.streaming_pull_manager
    level    WARNING
    message  "AcknowledgeError when lease-modacking a message."  (no arguments)
    exc_info AcknowledgeError(INVALID_ACK_ID), or AcknowledgeError(OTHER, "...
             EXACTLY_ONCE_ACKID_FAILURE ...")

Under load that is thousands of lines a minute, and nothing in them needs a
person: the worker renews the leases of its jobs itself, each with its own
request, and learns from its own answers which delivery lost its job.

:class:`RefusedModacks` is a :class:`logging.Filter` on that logger. It drops
exactly those records (:func:`is_refused_modack`), counts them (its
:attr:`~RefusedModacks.total`, and the ``client_modacks_refused`` counter of
the worker's :class:`~pubsub_worker._support.metrics.Metrics`), and logs one
summary line at most once per interval instead: the first refusal at once,
then the count of each interval when the next refusal comes after it, and what
is left when the worker stops (:meth:`~RefusedModacks.flush`). Every other
record of that logger, a lease-modack failure for another reason included
(``PERMISSION_DENIED``, ``FAILED_PRECONDITION``, ``OTHER`` with any other
status), passes untouched. :func:`install` puts one filter on the logger per
process, whoever asks first (the ``pubsub-worker`` command's logging set-up,
:func:`pubsub_worker.run`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from .metrics import Counter, Metrics

__all__ = [
    "MODACK_FAILURE_MESSAGE",
    "STOCK_LOGGER",
    "SUMMARY_INTERVAL_S",
    "RefusedModacks",
    "install",
    "installed",
    "is_refused_modack",
    "uninstall",
]

STOCK_LOGGER = "google.cloud.pubsub_v1.subscriber._protocol.streaming_pull_manager"
"""The stock client's logger that reports failed lease modacks."""

MODACK_FAILURE_MESSAGE = "AcknowledgeError when lease-modacking a message."
"""The message of that record, exactly as the client logs it (google-cloud-pubsub 2.x)."""

SUMMARY_INTERVAL_S = 60.0
"""At most one summary line per this many seconds."""

_BATCH_REFUSED = "EXACTLY_ONCE_ACKID_FAILURE"
"""In an ``OTHER`` error's text: the request was refused because of another id in it."""

_LOGGER = logging.getLogger("pubsub_worker")


def is_refused_modack(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the stock client's log of a lease modack refused for an ack id.

    True only for the record described in the module docstring: that logger,
    that message without arguments, and an ``AcknowledgeError`` that is
    ``INVALID_ACK_ID``, or ``OTHER`` because the request held an invalid id.
    """
    if record.name != STOCK_LOGGER or record.msg != MODACK_FAILURE_MESSAGE or record.args:
        return False
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, AcknowledgeError):
        return False
    if error.error_code == AcknowledgeStatus.INVALID_ACK_ID:
        return True
    return error.error_code == AcknowledgeStatus.OTHER and _BATCH_REFUSED in str(error.info)


class RefusedModacks(logging.Filter):
    """Drops the stock client's refused-modack records; counts them; logs a summary line.

    ``clock`` (monotonic seconds) and ``logger`` are for tests. Thread-safe:
    ``_lock`` guards the counts, the time of the last line and the metrics.
    """

    def __init__(
        self,
        *,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = _LOGGER,
    ) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._logger = logger
        self._lock = threading.Lock()
        self._pending = 0
        self._total = 0
        self._last_line: float | None = None
        self._metrics: weakref.ref[Metrics] | None = None

    @property
    def total(self) -> int:
        """Refused modacks dropped since this filter was made."""
        with self._lock:
            return self._total

    def count_into(self, metrics: Metrics | None) -> None:
        """Count from now on into ``metrics`` (the worker started last; None: nowhere).

        The record does not say which subscriber it came from, so one process
        counts into one worker's metrics: the latest to start. The filter holds
        them weakly, and counts nowhere once that worker is gone.
        """
        with self._lock:
            self._metrics = weakref.ref(metrics) if metrics is not None else None

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for a refused modack, after counting it; True for any other record."""
        if not is_refused_modack(record):
            return True
        now = self._clock()
        with self._lock:
            self._total += 1
            self._pending += 1
            metrics = self._metrics() if self._metrics is not None else None
            due = self._last_line is None or now - self._last_line >= self._interval_s
            shown = self._take(now) if due else 0
        if metrics is not None:
            metrics.inc(Counter.CLIENT_MODACKS_REFUSED)
        if shown:
            self._line(shown)
        return False

    def flush(self) -> None:
        """Log what was dropped since the last line, if anything (when the worker stops)."""
        with self._lock:
            shown = self._take(self._clock()) if self._pending else 0
        if shown:
            self._line(shown)

    def _take(self, now: float) -> int:
        """The count to show now, which starts a new interval (under ``_lock``)."""
        shown, self._pending, self._last_line = self._pending, 0, now
        return shown

    def _line(self, count: int) -> None:
        self._logger.info(
            "Pub/Sub client: %d lease renewal(s) refused for messages already acked or "
            "redelivered (INVALID_ACK_ID; the worker renews its own jobs' leases); counted in "
            "client_modacks_refused, the client's tracebacks left out, at most one line per %.0f s",
            count,
            self._interval_s,
        )


_INSTALL_LOCK = threading.Lock()  # guards _installed
_installed: RefusedModacks | None = None


def install(metrics: Metrics | None = None) -> RefusedModacks:
    """The process's filter on the stock client's logger, added on the first call.

    With ``metrics``, it counts into them from now on (see
    :meth:`RefusedModacks.count_into`). Idempotent: one filter per process.
    """
    global _installed  # noqa: PLW0603 - one filter per process, on a process-wide logger
    with _INSTALL_LOCK:
        if _installed is None:
            _installed = RefusedModacks()
            logging.getLogger(STOCK_LOGGER).addFilter(_installed)
        refused = _installed
    if metrics is not None:
        refused.count_into(metrics)
    return refused


def installed() -> RefusedModacks | None:
    """The filter :func:`install` added, if any."""
    with _INSTALL_LOCK:
        return _installed


def uninstall() -> None:
    """Remove the filter (its pending count is logged first); the records show in full again."""
    global _installed  # one filter per process, as in install()
    with _INSTALL_LOCK:
        refused, _installed = _installed, None
    if refused is not None:
        refused.flush()
        logging.getLogger(STOCK_LOGGER).removeFilter(refused)
