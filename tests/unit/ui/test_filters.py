"""The job list's filters, read from a query string: what is accepted, refused, and linked."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from pubsub_worker._ops.jobs import encode_cursor
from pubsub_worker._ops.jobs_view import JobView
from pubsub_worker.stores.base import Status
from pubsub_worker.ui.filters import BadFilter, Filters, parse_time

NOW = datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc)


def test_an_empty_query_filters_nothing_and_says_so_as_the_cli_would() -> None:
    filters = Filters.from_query({})
    assert filters == Filters()
    assert not filters.filtered
    assert filters.params() == {}
    assert filters.cli() == "pubsub-worker jobs list"


def test_every_filter_is_read_and_written_back_the_same() -> None:
    cursor = encode_cursor(NOW, "ab" * 32)
    query = {
        "status": "failed",
        "reason": "attempts",
        "since": "2026-12-01T08:00",
        "until": "2026-12-01 09:00:30",
        "prefix": "op-10",
        "after": cursor,
    }
    filters = Filters.from_query(query)
    assert filters.status is Status.FAILED
    assert filters.reason == "attempts"
    assert filters.since == datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
    assert filters.until == datetime(2026, 12, 1, 9, 0, 30, tzinfo=timezone.utc)
    assert Filters.from_query(filters.params()) == filters
    assert filters.params(after=None)["prefix"] == "op-10"
    assert "after" not in filters.params(after=None)
    assert filters.filtered
    assert filters.cli() is None  # jobs list has no prefix, reason or time range


def test_status_and_cursor_are_the_cli_s_own() -> None:
    cursor = encode_cursor(NOW, "cd" * 32)
    filters = Filters.from_query({"status": "running", "after": cursor})
    assert filters.cli() == f"pubsub-worker jobs list --status running --after {cursor}"


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"status": "stuck"}, "status='stuck': expected one of running, released"),
        ({"status": "failed", "reason": "bored"}, "reason='bored': expected one of attempts"),
        ({"reason": "attempts"}, "reason: only with status=failed"),
        ({"since": "yesterday"}, "since='yesterday': expected a UTC time"),
        ({"since": "2026-12-02", "until": "2026-12-01"}, "since must be before until"),
        ({"after": "not-a-cursor"}, "after: not a page cursor"),
        ({"prefix": "x" * 1025}, "prefix: at most 1024 bytes"),
    ],
)
def test_a_value_not_accepted_is_refused_naming_the_parameter(
    query: dict[str, str], says: str
) -> None:
    with pytest.raises(BadFilter) as raised:
        Filters.from_query(query)
    assert says in str(raised.value)


def test_a_time_is_utc_in_each_accepted_form() -> None:
    expected = datetime(2026, 12, 1, tzinfo=timezone.utc)
    for text in ("2026-12-01", "2026-12-01T00:00", "2026-12-01 00:00:00", " 2026-12-01T00:00:00 "):
        assert parse_time("since", text) == expected
    assert parse_time("since", "") is None


def _view(key: str | None) -> JobView:
    return JobView.from_fields("ef" * 32, {"key": key, "status": "completed", "epoch": 1}, NOW)


def test_the_prefix_matches_the_start_of_the_key_only() -> None:
    filters = Filters(prefix="op-1")
    assert filters.matches(_view("op-1001"))
    assert not filters.matches(_view("xop-1001"))
    assert not filters.matches(_view(None))
    assert Filters().matches(_view(None))
