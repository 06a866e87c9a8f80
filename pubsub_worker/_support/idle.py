"""A worker that says it is alive: one line per interval while no message arrives.

A worker waiting for messages is silent, and so is one whose messages never
come (a wrong subscription, a publisher that stopped, a stream the Pub/Sub
emulator still hands messages to after a restart). :class:`IdleReporter`
tells them apart for a person reading the log: every ``interval_s`` without a
new message it logs what the worker consumes, how many jobs it has in hand
and when its last message came::

    idle: no message from projects/p/subscriptions/jobs for 2 min; 0 in flight;
    last message at 2026-12-02 10:04:31 UTC

The reporter learns all of it from one callable that returns an
:class:`Activity`; it never reaches into the worker. One named daemon thread
wakes once per interval; :meth:`IdleReporter.check` is one such wake-up, for
tests with a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import NamedTuple

from pubsub_worker.settings import Settings

from .metrics import Metrics

__all__ = ["EMULATOR_HINT", "IDLE_INTERVAL_S", "Activity", "IdleReporter", "report_idle"]

IDLE_INTERVAL_S = 60.0
"""How long without a message before the first idle line, and between two of them."""

EMULATOR_HINT = (
    "on the Pub/Sub emulator, a worker of this subscription killed in the last 30 min can "
    "still hold a stream there that takes messages and keeps each for a lease: "
    "`python -m emulator end-streams {subscription}` ends such streams (only while no other "
    "worker consumes it; docs/emulator.md, stale streams)"
)
"""What the idle line adds against the emulator (the subscription's path filled in)."""

_LOGGER = logging.getLogger("pubsub_worker")


class Activity(NamedTuple):
    """What the idle line says about a worker, read afresh at every check."""

    subscription: str
    """The subscription path consumed."""
    in_flight: int
    """Jobs in the worker's hands right now."""
    last_message_at: float | None
    """When the last message arrived (seconds since the epoch), or None: none yet."""


class IdleReporter:
    """Logs one idle line per ``interval_s`` while ``activity()`` shows no new message.

    ``interval_s`` defaults to :data:`IDLE_INTERVAL_S` (read when the reporter
    is made). Times are read from ``clock`` (seconds since the epoch, like
    :func:`time.time`), which tests replace. The first line comes
    ``interval_s`` after :meth:`start` (or the last message), then one per
    interval while nothing arrives; a message ends the silence at once.
    ``hint`` is appended to each line (what may explain the silence). A
    failing ``activity()`` is logged, never raised. :meth:`start` and
    :meth:`stop` are idempotent; ``_lock`` guards the thread and the start time.
    """

    def __init__(
        self,
        activity: Callable[[], Activity],
        *,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.time,
        hint: str = "",
        logger: logging.Logger = _LOGGER,
    ) -> None:
        self._activity = activity
        self._interval_s = IDLE_INTERVAL_S if interval_s is None else interval_s
        self._clock = clock
        self._hint = hint
        self._logger = logger
        self._lock = threading.Lock()
        self._started_at = clock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the reporting thread; the silence counts from now."""
        with self._lock:
            if self._thread is not None:
                return
            self._started_at = self._clock()
            self._wake.clear()
            self._thread = threading.Thread(
                target=self._loop, name="pubsub-worker-idle", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop reporting (no line after this returns)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._wake.wait(self._interval_s):
            self.check()

    def check(self) -> str | None:
        """One wake-up: log and return the idle line if nothing arrived for an interval."""
        try:
            activity = self._activity()
        except Exception:  # a broken reading must not end the reporting
            self._logger.exception("idle report: the worker's activity could not be read")
            return None
        now = self._clock()
        with self._lock:
            started_at = self._started_at
        quiet_s = now - max(started_at, activity.last_message_at or started_at)
        if quiet_s < self._interval_s:
            return None
        if activity.last_message_at is None:
            last = f"no message since the start at {_utc(started_at)}"
        else:
            last = f"last message at {_utc(activity.last_message_at)}"
        line = (
            f"idle: no message from {activity.subscription} for {_duration(quiet_s)}; "
            f"{activity.in_flight} in flight; {last}"
        )
        if self._hint:
            line = f"{line}; {self._hint}"
        self._logger.info("%s", line)
        return line


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    """``45 s``, ``2 min``, ``1 h 5 min``: as long a silence reads best."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def report_idle(
    settings: Settings, metrics: Metrics, in_flight: Callable[[], int], *, pull: bool = True
) -> IdleReporter:
    """A started reporter for a worker of ``settings.subscription_path``.

    Its last message is the last time ``metrics`` counted one received
    (:attr:`~pubsub_worker._support.metrics.Counter.RECEIVED`); ``in_flight``
    says how many jobs it has in hand. Against the emulator the line carries
    :data:`EMULATOR_HINT` (``pull``: a push endpoint holds no stream). Stop it with
    :meth:`IdleReporter.stop`.
    """
    subscription = settings.subscription_path

    def activity() -> Activity:
        return Activity(subscription, in_flight(), metrics.last_received_at())

    emulated = pull and settings.pubsub_emulator_host
    hint = EMULATOR_HINT.format(subscription=subscription) if emulated else ""
    reporter = IdleReporter(activity, hint=hint)
    reporter.start()
    return reporter
