"""Spans and metrics by the messaging conventions, read back through OpenTelemetry's SDK.

A scenario on the in-memory store with a completed job, a retry, a lost
ownership and a failure, then the exporter's spans and the reader's metrics
are checked: one process span per delivery (or the client's own, when its
tracing is on), a span per step under it, the job's deliveries linked, and
the histograms and counters with their attributes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pubsub_worker
from pubsub_worker.stores import base as s
from tests.support.world import SUB, FakeMessage, World, world

__all__ = ["world"]

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def sdk() -> None:
    """The SDK's in-memory exporter and reader as the global providers (once per process)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


@pytest.fixture(autouse=True)
def fresh() -> None:
    _EXPORTER.clear()


def process_spans() -> list[ReadableSpan]:
    return [span for span in _EXPORTER.get_finished_spans() if span.name == "jobs process"]


def points(name: str) -> list[Any]:
    data = _READER.get_metrics_data()
    found: list[Any] = []
    if data is None:
        return found  # nothing recorded yet
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def test_a_process_span_per_delivery_with_a_span_per_step(world: Callable[..., World]) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        job.step("b", lambda: 2)

    w = world(handle)
    message = FakeMessage(op="k")
    message.delivery_attempt = 1
    assert w.deliver(message) == "ack"

    (span,) = process_spans()
    attributes = dict(span.attributes or {})
    assert span.kind is trace.SpanKind.CONSUMER
    assert attributes["messaging.system"] == "gcp_pubsub"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.subscription.name"] == SUB
    assert attributes["messaging.message.id"] == message.message_id
    assert attributes["messaging.gcp_pubsub.message.delivery_attempt"] == 1
    assert (attributes["pubsub_worker.job.key"], attributes["pubsub_worker.job.epoch"]) == ("k", 1)
    assert attributes["pubsub_worker.outcome"] == "complete"
    assert "error.type" not in attributes
    steps = [x for x in _EXPORTER.get_finished_spans() if x.name.startswith("step ")]
    assert [x.name for x in steps] == ["step a", "step b"]
    assert all(x.parent is not None and x.parent.span_id == span.context.span_id for x in steps)


def test_deliveries_of_one_job_are_linked_and_errors_typed(world: Callable[..., World]) -> None:
    def flaky(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        if job.attempt == 1:
            raise ValueError("first attempt fails")

    w = world(flaky)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert w.deliver(FakeMessage(op="k")) == "ack"

    first, second = process_spans()
    assert dict(first.attributes or {})["error.type"] == "ValueError"
    assert dict(first.attributes or {})["pubsub_worker.outcome"] == "retry"
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert w.record()["trace_parent"].split("-")[2] == f"{first.context.span_id:016x}"


def tally(name: str, label: str) -> Counter[str]:
    """A counter's value, or a histogram's count, per value of attribute ``label``, so far.

    The reader's points are cumulative over the module's tests: a test compares
    a tally taken after its scenario with one taken before.
    """
    found: Counter[str] = Counter()
    for point in points(name):
        value = point.count if isinstance(point, HistogramDataPoint) else point.value
        found[str(dict(point.attributes).get(label, ""))] += value
    return found


COUNTED = {
    "pubsub_worker.lost_ownership": "phase",
    "pubsub_worker.stale_commits": "",
    "pubsub_worker.failed": "reason",
    "messaging.process.duration": "pubsub_worker.outcome",
    "pubsub_worker.step.duration": "step",
}
"""The metrics the next test counts exactly, each by the attribute it is labelled with."""


def test_a_lost_ownership_and_a_failure_are_counted_by_phase(world: Callable[..., World]) -> None:
    before = {name: tally(name, label) for name, label in COUNTED.items()}

    def stolen(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)
        snap = w.store.get(job._core.identity.doc_id)
        assert snap is not None
        w.store.update(job._core.identity.doc_id, {(s.EPOCH,): 5}, expected=snap.version)
        job.step("b", lambda: 2)

    def permanent(message: Any, job: pubsub_worker.Job) -> None:
        raise pubsub_worker.PermanentError("never")

    w = world(stolen)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    other = world(permanent)
    assert other.deliver(FakeMessage(op="p")) == "ack"

    (lost, failed) = process_spans()
    assert dict(lost.attributes or {})["error.type"] == "LostOwnership"
    assert dict(failed.attributes or {})["error.type"] == "PermanentError"
    counted = {name: tally(name, label) - before[name] for name, label in COUNTED.items()}
    assert counted == {
        # The commit of a's record, before b, was refused: one stale commit, ownership lost.
        "pubsub_worker.lost_ownership": {"step_commit": 1},
        "pubsub_worker.stale_commits": {"": 1},
        "pubsub_worker.failed": {"permanent": 1},
        "messaging.process.duration": {"nack": 1, "review": 1},  # one per delivery
        "pubsub_worker.step.duration": {"a": 1},  # b never ran
    }
    assert w.wrapped.metrics.snapshot()["utilization"] == 0.0  # nothing in hand any more


def test_a_step_that_raises_has_its_span_and_no_duration(world: Callable[..., World]) -> None:
    """Its span ends with the error; only steps that ended well are timed."""
    before = tally("pubsub_worker.step.duration", "step")

    def boom() -> int:
        raise ValueError("the step's call failed")

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        job.step("fine", lambda: 1)
        job.step("boom", boom)

    w = world(handler)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    spans = {x.name: x for x in _EXPORTER.get_finished_spans() if x.name.startswith("step ")}
    assert spans["step fine"].status.is_ok
    assert not spans["step boom"].status.is_ok
    assert [event.name for event in spans["step boom"].events] == ["exception"]
    timed = tally("pubsub_worker.step.duration", "step") - before
    assert timed == {"fine": 1}


def test_the_clients_own_process_span_is_used_not_duplicated(world: Callable[..., World]) -> None:
    """With the client's tracing on, its ``process`` span is current: no second one."""

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)

    w = world(handle)
    message = FakeMessage(op="k")
    message.opentelemetry_data = object()  # what the client sets when its tracing is on
    tracer = trace.get_tracer("google.cloud.pubsub_v1")
    with tracer.start_as_current_span("jobs process") as client_span:
        assert w.deliver(message) == "ack"

    (span,) = process_spans()
    assert span.context.span_id == client_span.get_span_context().span_id
    assert dict(span.attributes or {})["pubsub_worker.job.key"] == "k"
    (step,) = [x for x in _EXPORTER.get_finished_spans() if x.name == "step a"]
    assert step.parent is not None
    assert step.parent.span_id == span.context.span_id


def test_without_providers_no_span_is_made_and_no_instrument_called(
    world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before an application sets a provider, a delivery makes no span and reports nothing."""
    import opentelemetry.metrics._internal as metrics_internal
    import opentelemetry.trace as trace_module

    from pubsub_worker._support import tracing
    from pubsub_worker._support.metrics import Histogram

    monkeypatch.setattr(trace_module, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    made: list[str] = []
    monkeypatch.setattr(tracing._tracer, "start_span", lambda name, **_: made.append(name))

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("a", lambda: 1)

    w = world(handle)
    instruments = w.wrapped.metrics._otel
    for counter in list(instruments):
        monkeypatch.setattr(instruments[counter], "add", lambda *a, **k: made.append("add"))
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert made == []
    assert process_spans() == []
    assert not w.wrapped.metrics.exporting
    assert w.wrapped.metrics.histogram(Histogram.PROCESS_DURATION).count == 1  # kept in process


def test_histogram_buckets_take_their_upper_bound() -> None:
    from pubsub_worker._support.metrics import BUCKETS_S, HistogramSnapshot

    snap = HistogramSnapshot()
    for value in (0.0, BUCKETS_S[0], BUCKETS_S[0] + 1e-9, BUCKETS_S[-1], BUCKETS_S[-1] + 1):
        snap.add(value)
    assert snap.counts[0] == 2
    assert snap.counts[1] == 1
    assert snap.counts[len(BUCKETS_S) - 1] == 1
    assert snap.counts[len(BUCKETS_S)] == 1
    assert snap.count == 5
