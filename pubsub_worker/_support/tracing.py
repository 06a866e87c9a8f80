"""OpenTelemetry spans by the messaging semantic conventions for GCP Pub/Sub.

Without ``opentelemetry-api`` (``pip install 'pubsub-exactly-once[otel]'``), or
without a tracer provider set by the application (an SDK), every call here
costs a function call and records nothing: no span object is made.

* **One process span per delivery.** When the Pub/Sub client's own tracing
  is on (``SubscriberClient(..., subscriber_options=SubscriberOptions(
  enable_open_telemetry_tracing=True))``) the client has already opened a
  ``{subscription} process`` span under its ``subscribe`` span and made it
  current: the library adds its attributes to that span instead of opening a
  duplicate. Otherwise it opens ``{subscription} process`` itself (kind
  ``CONSUMER``).
* Attributes: ``messaging.system=gcp_pubsub``,
  ``messaging.operation.type=process``,
  ``messaging.destination.subscription.name``, ``messaging.message.id``,
  ``messaging.gcp_pubsub.message.delivery_attempt``, and the library's
  ``pubsub_worker.job.key`` (clipped), ``pubsub_worker.job.epoch``,
  ``pubsub_worker.delivery.generation``, ``pubsub_worker.job.attempt``,
  ``pubsub_worker.outcome``, plus ``error.type`` (low cardinality: an
  exception class name or ``INVALID_ACK_ID``) when the delivery did not
  complete.
* **All deliveries of one job are linked**: the first delivery's span
  context is stored in the job document (``trace_parent``, W3C
  ``traceparent`` text) and every later delivery's span links to it.
* **A span per step** (``step {name}``), a child of the delivery's span on
  whatever thread or event loop the step runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any

from .metrics import Histogram, Metrics
from .text import display

__all__ = ["DeliveryTrace", "MeasuredStep", "parse_trace_parent"]

try:
    from opentelemetry import trace as _trace
except ImportError:  # optional dependency
    _trace: Any = None  # type: ignore[no-redef]
    _tracer: Any = None
else:
    _tracer = _trace.get_tracer("pubsub_worker")

SYSTEM = "gcp_pubsub"
_KEY_SHOWN_BYTES = 128
_NO_SPAN: AbstractContextManager[None] = nullcontext()
"""A step's context when nothing is recorded: shared, it holds no state."""


def _provider_set() -> bool:
    """Whether a tracer provider (an SDK) is set: without one every span is a no-op.

    ``opentelemetry.trace`` keeps the provider set by ``set_tracer_provider``
    (or named by ``OTEL_PYTHON_TRACER_PROVIDER``, loaded when this module asked for
    its tracer) in a module global, None until then. Read directly, it costs
    an attribute lookup per delivery instead of a span object; if a later
    ``opentelemetry-api`` renames it, spans are made as before.
    """
    return getattr(_trace, "_TRACER_PROVIDER", _trace) is not None


class DeliveryTrace:
    """The process span of one delivery, and the step spans under it."""

    def __init__(self, message: Any, subscription: str) -> None:
        self._span: Any = None
        self._own = False
        self.spanned = False
        """A span is open for the delivery (an SDK is set): else every call here is a no-op."""
        if _tracer is None or not _provider_set():
            return  # nothing would be recorded: no span, no attributes
        current = _trace.get_current_span()
        if getattr(message, "opentelemetry_data", None) is not None and current.is_recording():
            self._span = current  # the client's own process span: never a duplicate
        else:
            self._span = _tracer.start_span(
                f"{subscription.rsplit('/', 1)[-1]} process", kind=_trace.SpanKind.CONSUMER
            )
            self._own = True
        self.spanned = True
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.subscription.name": subscription,
            "messaging.message.id": str(message.message_id),
        }
        attempt = getattr(message, "delivery_attempt", None)
        if attempt is not None:
            attributes["messaging.gcp_pubsub.message.delivery_attempt"] = int(attempt)
        self._span.set_attributes(attributes)

    @property
    def recording(self) -> bool:
        """Whether anything is recorded (an SDK is configured)."""
        return self._span is not None and bool(self._span.is_recording())

    def trace_parent(self) -> str | None:
        """This span's context as a W3C ``traceparent``, to store with a new job."""
        if not self.spanned or not self.recording:  # spanned first: read without a call
            return None
        context = self._span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    def claimed(
        self, *, key: str, epoch: int, generation: int, attempt: int, first: str | None
    ) -> None:
        """The job was claimed; ``first`` is the first delivery's ``traceparent``, to link to."""
        if not self.recording:
            return
        self._span.set_attributes(
            {
                "pubsub_worker.job.key": display(key, _KEY_SHOWN_BYTES),
                "pubsub_worker.job.epoch": epoch,
                "pubsub_worker.job.attempt": attempt,
                "pubsub_worker.delivery.generation": generation,
            }
        )
        context = parse_trace_parent(first)
        if context is not None and context != self._span.get_span_context():
            self._span.add_link(context, {"pubsub_worker.link": "first delivery of the job"})

    def step(self, name: str) -> AbstractContextManager[None]:
        """A child span around one step's function and record (nothing if none is recorded)."""
        if not self.recording:
            return _NO_SPAN
        return self._step_span(name)

    @contextmanager
    def _step_span(self, name: str) -> Iterator[None]:
        parent = _trace.set_span_in_context(self._span)
        with _tracer.start_as_current_span(
            f"step {name}", context=parent, attributes={"pubsub_worker.step": name}
        ):
            yield

    def ended(self, outcome: str, error_type: str | None) -> None:
        """The delivery's outcome is settled: record it, and end the span if it is ours."""
        if self._span is None:
            return
        if self.recording:
            self._span.set_attribute("pubsub_worker.outcome", outcome)
            if error_type is not None:
                self._span.set_attribute("error.type", error_type)
                self._span.set_status(_trace.Status(_trace.StatusCode.ERROR))
        if self._own:
            self._span.end()


def parse_trace_parent(text: str | None) -> Any:
    """A ``SpanContext`` from a W3C ``traceparent``, or None if absent or malformed."""
    if _trace is None or not text:
        return None
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return _trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=_trace.TraceFlags(flags),
    )


class MeasuredStep:
    """A step's span (a child of the delivery's) around a block, and its duration observed
    (``pubsub_worker.step.duration``) when the block ends without an error. A plain
    object: a generator context manager costs several calls more per step."""

    __slots__ = ("_metrics", "_name", "_span", "_start", "_trace")

    def __init__(self, trace: DeliveryTrace | None, metrics: Metrics, name: str) -> None:
        self._trace = trace
        self._metrics = metrics
        self._name = name
        self._span: AbstractContextManager[None] | None = None
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.monotonic()
        if self._trace is not None and self._trace.spanned and self._trace.recording:
            span = self._trace.step(self._name)
            span.__enter__()
            self._span = span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._span is not None:
            self._span.__exit__(kind, error, traceback)
        if kind is None:
            elapsed = time.monotonic() - self._start
            self._metrics.observe(Histogram.STEP_DURATION, elapsed, step=self._name)
