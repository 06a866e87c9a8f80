"""Each counter and histogram has a description of its own, and ``/metrics`` shows it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pubsub_worker._support.metrics import Counter, Histogram, Metrics
from pubsub_worker._worker.serve import prometheus_text


def test_every_counter_and_histogram_has_its_own_description() -> None:
    described = [*Counter, *Histogram]
    descriptions = [member.__doc__ for member in described]
    assert all(descriptions), [m for m in described if not m.__doc__]
    assert len(set(descriptions)) == len(described)  # no two share one
    assert Counter.__doc__ not in descriptions
    assert Histogram.__doc__ not in descriptions
    assert Counter.STALE_COMMITS.__doc__ == (
        "Conditional writes of this worker rejected because another owner holds the job now."
    )
    assert Counter("received") is Counter.RECEIVED  # looked up by value as before


def test_the_prometheus_page_gives_each_series_its_own_help_line() -> None:
    metrics = Metrics()
    metrics.inc(Counter.COMPLETED, 3)
    helps = {
        family.name: family.documentation
        for family in text_string_to_metric_families(prometheus_text(metrics).decode())
    }
    counted = [helps[f"pubsub_worker_{counter.value}"] for counter in Counter]
    assert counted == [counter.__doc__ for counter in Counter]
    assert len(set(counted)) == len(Counter)
    assert helps["messaging_process_duration_seconds"] == Histogram.PROCESS_DURATION.__doc__
    assert helps["pubsub_worker_step_duration_seconds"] == Histogram.STEP_DURATION.__doc__


def test_only_a_received_message_moves_the_last_message_time() -> None:
    metrics = Metrics()
    metrics.inc(Counter.COMPLETED)
    assert metrics.last_received_at() is None
    metrics.inc(Counter.RECEIVED)
    received = metrics.last_received_at()
    assert received is not None
    metrics.inc(Counter.COMPLETED)
    assert metrics.last_received_at() == received
    assert metrics.get(Counter.RECEIVED) == 1
    assert metrics.get(Counter.COMPLETED) == 2
