"""How the dashboard shows times, ages, sizes and stored text."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pubsub_worker.ui import format as fmt

NOW = datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (59.9, "59 s"),
        (90, "1 min 30 s"),
        (600, "10 min"),
        (3 * 3600 + 20 * 60, "3 h 20 min"),
        (2 * 86400, "2 d"),
        (2 * 86400 + 4 * 3600, "2 d 4 h"),
    ],
)
def test_a_duration_shows_its_two_largest_units(seconds: float, shown: str) -> None:
    assert fmt.duration(seconds) == shown
    assert fmt.age(NOW - timedelta(seconds=seconds), NOW) == shown


def test_an_age_in_the_future_is_zero_and_none_is_a_dash() -> None:
    assert fmt.age(NOW + timedelta(seconds=5), NOW) == "0 s"
    assert fmt.age(None) == "-"
    assert fmt.when(None) == "-"
    assert fmt.when(NOW) == "2026-12-01 09:30:00 UTC"


def test_sizes() -> None:
    assert [fmt.size(n) for n in (None, 74, 1536, 3 * 1024 * 1024)] == [
        "-",
        "74 B",
        "1.5 KiB",
        "3.0 MiB",
    ]


def test_a_key_cannot_break_a_line_and_is_clipped() -> None:
    assert fmt.key_text("a\nb\x1b[31m") == "a\\nb\\x1b[31m"
    assert fmt.key_text(None) == "(no key)"
    assert len(fmt.key_text("k" * 500, 96).encode()) <= 100
    assert fmt.text("line 1\nline\t2") == "line 1\nline\\t2"
    assert fmt.text("") == "-"
