"""OpenTelemetry spans for jobs and steps, when ``opentelemetry-api`` is installed.

Without it (or without an SDK configured by the application) spans cost a
function call. Span names: ``pubsub_worker.job`` (one delivery, attributes
``messaging.message.id`` and ``pubsub_worker.key``) and ``pubsub_worker.step``
(``pubsub_worker.step``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["span"]

try:
    from opentelemetry import trace as _trace
except ImportError:  # optional dependency
    _tracer: Any = None
else:
    _tracer = _trace.get_tracer("pubsub_worker")


@contextmanager
def span(name: str, **attributes: str | int) -> Iterator[None]:
    """A span around a block; a no-op without OpenTelemetry."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name, attributes=attributes):
        yield
