"""Counters and gauges of a worker, kept in process and exported through OpenTelemetry.

The in-process :class:`Metrics` is always there (``wrapper.metrics.snapshot()``);
when ``opentelemetry-api`` is installed (``pip install 'pubsub-exactly-once[otel]'``)
every counter is also an OpenTelemetry counter named ``pubsub_worker.<name>``
and the gauges are observable gauges, reported to whatever SDK the
application configured (without an SDK they cost nothing).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

__all__ = ["BUCKETS_S", "Counter", "Histogram", "HistogramSnapshot", "Metrics"]


_D = TypeVar("_D", bound="_Described")


class _Described(str, Enum):
    """A ``str`` enum whose members are ``NAME = value, description``: ``__doc__`` is each's own.

    (A docstring under a member documents the source only: at run time every member's
    ``__doc__`` would be the class's.)
    """

    _value_: str

    def __new__(cls: type[_D], value: str, description: str = "") -> _D:
        member = str.__new__(cls, value)
        member._value_ = value
        member.__doc__ = description
        return member


class Counter(_Described):
    """What a worker counts. Each member is one monotonically increasing counter.

    A member's ``__doc__`` is its own description: the HELP line of its Prometheus
    series (:mod:`pubsub_worker._worker.serve`) and its OpenTelemetry description.
    """

    RECEIVED = "received", "Deliveries handed to the wrapper."
    COMPLETED = "completed", "Jobs this worker completed (completion record committed)."
    ALREADY_DONE = (
        "already_done",
        "Deliveries of a job that was already completed or failed: acked without running.",
    )
    STEPS_RUN = "steps_run", "Step functions run (a skipped, recorded step is not counted)."
    STEPS_SKIPPED = "steps_skipped", "Steps answered from their record on a redelivery."
    RETRIED = "retried", "Jobs released after a retryable failure, for another attempt."
    FAILED = "failed", "Jobs sent to the reviewed failure path (dead-letter arrivals)."
    LOST_OWNERSHIP = (
        "lost_ownership",
        "Callbacks stopped because another delivery or owner took over.",
    )
    ACKS_LOST = (
        "acks_lost",
        "Acks refused with INVALID_ACK_ID/FAILED_PRECONDITION after completion (job is done).",
    )
    ACK_ERRORS = "ack_errors", "Acks that failed otherwise or timed out (a redelivery will ack)."
    BUSY = "busy", "Deliveries not run because another owner held a live lease."
    RENEWALS = "renewals", "Lease renewals sent because the job made progress."
    RENEWAL_FAILURES = "renewal_failures", "Lease renewals that failed."
    ABANDONED = "abandoned", "Jobs abandoned after MAX_PROCESSING_SECONDS."
    OUTBOX_PUBLISHED = "outbox_published", "Outbox messages published."
    OUTBOX_ERRORS = (
        "outbox_errors",
        "Outbox publishes that failed (the entry stays unsent and is published again).",
    )
    DEFERRED = (
        "deferred",
        "Deliveries left to come back after a backoff (busy owner, store or failure path down).",
    )
    FAILURE_PATH_ERRORS = (
        "failure_path_errors",
        "Attempts to send a message to the failure path that failed (it is deferred, not lost).",
    )
    CLIENT_MODACKS_REFUSED = (
        "client_modacks_refused",
        "Lease renewals of the stock client refused for a message already acked or "
        "redelivered (their log lines are summarised: pubsub_worker._support.client_logs).",
    )
    STALLED = (
        "stalled",
        "Deliveries given up after a lease without progress (Pub/Sub redelivers them).",
    )
    STALE_COMMITS = (
        "stale_commits",
        "Conditional writes of this worker rejected because another owner holds the job now.",
    )
    HELD_RELEASED = (
        "held_released",
        "Messages the stock client held beyond flow control with its stream running, handed "
        "out by the worker (the client releases them only while paused).",
    )


class Histogram(_Described):
    """Durations, in seconds. Each member is one histogram (OpenTelemetry name in the value).

    A member's ``__doc__`` is its own description, as for :class:`Counter`.
    """

    PROCESS_DURATION = (
        "messaging.process.duration",
        "One delivery in the wrapper, from the callback's start to its settlement.",
    )
    STEP_DURATION = (
        "pubsub_worker.step.duration",
        "One step that ran (its function and its record).",
    )


BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Histogram bucket bounds, in seconds (OpenTelemetry's explicit buckets, and Prometheus')."""


_PROVIDER = "_METER_PROVIDER"
"""Where ``opentelemetry.metrics`` keeps the meter provider set (see :func:`_provider_set`)."""


def _provider_set() -> bool:
    """Whether a meter provider (an SDK) is set: until then every instrument is a no-op.

    ``opentelemetry.metrics`` keeps the provider set by ``set_meter_provider`` in a
    module global, None until then (its proxy instruments forward to it once set).
    Read directly, it spares a no-op call per count; if a later
    ``opentelemetry-api`` renames it, every count is reported as before.
    """
    return getattr(_otel_internal, _PROVIDER, _otel_internal) is not None


try:
    from opentelemetry.metrics import _internal as _otel_internal
except ImportError:  # optional dependency: Metrics has no meter then
    _otel_internal: Any = None  # type: ignore[no-redef]


class HistogramSnapshot:
    """Counts per bucket (cumulative bounds in :data:`BUCKETS_S`, then +Inf), sum and count."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.sum = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(BUCKETS_S, value)] += 1  # the first bound >= value
        self.sum += value
        self.count += 1


class Metrics:
    """Thread-safe counters plus gauges read from callbacks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _counts and _received_at
        self._counts: dict[Counter, int] = dict.fromkeys(Counter, 0)
        self._received_at: float | None = None
        self._gauges: dict[str, Callable[[], float]] = {}
        self._descriptions: dict[str, str] = {}
        self._histograms: dict[Histogram, HistogramSnapshot] = {
            h: HistogramSnapshot() for h in Histogram
        }
        self._otel: dict[Counter, Any] = {}
        self._otel_histograms: dict[Histogram, Any] = {}
        try:
            from opentelemetry import metrics as otel_metrics  # noqa: PLC0415
        except ImportError:
            self._meter: Any = None
        else:
            self._meter = otel_metrics.get_meter("pubsub_worker")
            for counter in Counter:
                self._otel[counter] = self._meter.create_counter(
                    f"pubsub_worker.{counter.value}", description=counter.__doc__ or ""
                )
            for histogram in Histogram:
                self._otel_histograms[histogram] = self._meter.create_histogram(
                    histogram.value,
                    unit="s",
                    description=histogram.__doc__ or "",
                    explicit_bucket_boundaries_advisory=list(BUCKETS_S),
                )

    @property
    def exporting(self) -> bool:
        """Whether the OpenTelemetry instruments report anywhere (a meter provider is set).

        Without one they are no-ops, and a caller need not build their attributes.
        """
        return self._meter is not None and _provider_set()

    def inc(self, counter: Counter, amount: int = 1, **attributes: str) -> None:
        """Add ``amount`` to ``counter`` (the time too, for RECEIVED: :meth:`last_received_at`)."""
        if counter is Counter.RECEIVED:
            now = time.time()
            with self._lock:
                self._counts[counter] += amount
                self._received_at = now
        else:
            with self._lock:
                self._counts[counter] += amount
        # _provider_set(), inlined: it runs on every count
        if (
            self._meter is not None
            and getattr(_otel_internal, _PROVIDER, _otel_internal) is not None
        ):
            self._otel[counter].add(amount, attributes)

    def observe(self, histogram: Histogram, seconds: float, **attributes: str) -> None:
        """Record one duration in ``histogram``."""
        with self._lock:
            self._histograms[histogram].add(seconds)
        # _provider_set(), inlined: it runs on every count
        if (
            self._meter is not None
            and getattr(_otel_internal, _PROVIDER, _otel_internal) is not None
        ):
            self._otel_histograms[histogram].record(seconds, attributes)

    def histogram(self, histogram: Histogram) -> HistogramSnapshot:
        """A copy of one histogram's counts."""
        with self._lock:
            source = self._histograms[histogram]
            copy = HistogramSnapshot()
            copy.counts, copy.sum, copy.count = list(source.counts), source.sum, source.count
        return copy

    def gauges(self) -> dict[str, tuple[float, str]]:
        """Every gauge's current value and description."""
        return {
            name: (read(), self._descriptions.get(name, "")) for name, read in self._gauges.items()
        }

    def gauge(self, name: str, read: Callable[[], float], description: str) -> None:
        """Register a gauge whose value ``read()`` returns when observed."""
        self._gauges[name] = read
        self._descriptions[name] = description
        if self._meter is not None:
            from opentelemetry.metrics import CallbackOptions, Observation  # noqa: PLC0415

            def observe(_options: CallbackOptions) -> list[Observation]:
                return [Observation(read())]

            self._meter.create_observable_gauge(
                f"pubsub_worker.{name}", callbacks=[observe], description=description
            )

    def get(self, counter: Counter) -> int:
        """The current value of one counter."""
        with self._lock:
            return self._counts[counter]

    def last_received_at(self) -> float | None:
        """When RECEIVED last grew (seconds since the epoch), or None: never."""
        with self._lock:
            return self._received_at

    def snapshot(self) -> dict[str, float]:
        """Every counter and gauge by name."""
        with self._lock:
            values: dict[str, float] = {c.value: n for c, n in self._counts.items()}
        for name, read in self._gauges.items():
            values[name] = read()
        return values
