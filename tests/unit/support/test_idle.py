"""The idle line: one per interval while no message arrives, on a fake clock."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

import pytest

from pubsub_worker._support import idle
from pubsub_worker._support.idle import Activity, IdleReporter

SUB = "projects/p/subscriptions/jobs"
START = datetime(2026, 12, 2, 10, 0, 0, tzinfo=timezone.utc).timestamp()


class World:
    """A fake clock and the worker's activity, both moved by the test."""

    def __init__(self) -> None:
        self.now = START
        self.in_flight = 0
        self.last: float | None = None

    def clock(self) -> float:
        return self.now

    def activity(self) -> Activity:
        return Activity(SUB, self.in_flight, self.last)

    def reporter(self, **kwargs: object) -> IdleReporter:
        return IdleReporter(self.activity, interval_s=60.0, clock=self.clock, **kwargs)  # type: ignore[arg-type]


def test_silent_until_an_interval_passed_without_a_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pubsub_worker")
    world = World()
    reporter = world.reporter()
    world.now += 59.9
    assert reporter.check() is None
    world.now += 0.1
    line = reporter.check()
    assert line == (
        f"idle: no message from {SUB} for 60 s; 0 in flight; "
        "no message since the start at 2026-12-02 10:00:00 UTC"
    )
    assert [r.getMessage() for r in caplog.records if r.name == "pubsub_worker"] == [line]


def test_one_line_per_interval_while_nothing_arrives() -> None:
    world = World()
    reporter = world.reporter()
    lines = []
    for _ in range(4):
        world.now += 60.0
        lines.append(reporter.check())
    assert [line.split(";")[0] for line in lines if line] == [
        f"idle: no message from {SUB} for 60 s",
        f"idle: no message from {SUB} for 2 min",
        f"idle: no message from {SUB} for 3 min",
        f"idle: no message from {SUB} for 4 min",
    ]


def test_a_message_ends_the_silence_and_is_named_in_the_next_line() -> None:
    world = World()
    reporter = world.reporter()
    world.now += 60.0
    assert reporter.check() is not None
    world.last = world.now - 5.0  # a message came 5 s ago
    world.in_flight = 3
    assert reporter.check() is None
    world.now += 50.0
    assert reporter.check() is None  # 55 s without a message: not an interval yet
    world.now += 10.0
    line = reporter.check()
    assert line == (
        f"idle: no message from {SUB} for 65 s; 3 in flight; "
        "last message at 2026-12-02 10:00:55 UTC"
    )


def test_long_silences_read_in_hours_and_the_hint_follows() -> None:
    world = World()
    reporter = world.reporter(hint="on the emulator: see docs/emulator.md")
    world.now += 3900.0
    line = reporter.check()
    assert line is not None
    assert "for 1 h 5 min;" in line
    assert line.endswith("; on the emulator: see docs/emulator.md")


def test_a_failing_activity_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Activity:
        raise RuntimeError("gone")

    reporter = IdleReporter(broken, interval_s=60.0, clock=lambda: START + 600)
    assert reporter.check() is None
    assert "idle report: the worker's activity could not be read" in caplog.text


def test_the_default_interval_is_read_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    monkeypatch.setattr(idle, "IDLE_INTERVAL_S", 5.0)
    reporter = IdleReporter(world.activity, clock=world.clock)
    world.now += 5.0
    assert reporter.check() is not None


def test_the_thread_reports_and_stops() -> None:
    """Started, it checks once per interval on its own thread; stopped, it is gone."""
    world = World()
    reported = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("idle:"):
                reported.set()

    logger = logging.getLogger("test.idle.thread")
    logger.addHandler(Seen())
    logger.setLevel(logging.INFO)
    reporter = IdleReporter(world.activity, interval_s=0.01, clock=world.clock, logger=logger)
    reporter.start()
    reporter.start()  # idempotent: one thread
    assert [t.name for t in threading.enumerate()].count("pubsub-worker-idle") == 1
    world.now += 1.0  # the fake clock says a second went by: more than the interval
    assert reported.wait(30)
    reporter.stop()
    reporter.stop()
    assert "pubsub-worker-idle" not in [t.name for t in threading.enumerate()]
