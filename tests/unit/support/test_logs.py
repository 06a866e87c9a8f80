"""Keys are data, never format: hostile job keys through both formatters, one line per record."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from pubsub_worker._support.logs import (
    KEY_SHOWN_BYTES,
    JsonFormatter,
    TextFormatter,
    configure,
    job_logger,
    printable,
)

HOSTILE_KEYS = [
    "%s",
    "%(x)s",
    "%",
    "%%d %(asctime)s %-5.3f",
    "a\nERROR forged",
    "\x1b[31m",
    "\r",
    "tab\there\x00nul\x07bell\x7fdel",
    "line\u2028sep\u2029par\x85nel",
    "bidi\u202eevil",
    "back\\slash\\n",
    "k" * 5000,
    "é" * 2500,
    "\ud800",
    "lone \udfff and \ud83d pair-half",
    "",
    "a/b",
    "..",
    "__x__",
]

TEXT_FORMAT = "%(levelname)s %(name)s %(message)s"


@dataclass
class Captured:
    """A logger whose only handler writes UTF-8 (strictly) and records logging errors."""

    logger: logging.Logger
    handler: _Handler

    def output(self) -> str:
        self.handler.flush()
        return self.handler.raw.getvalue().decode("utf-8")

    def lines(self) -> list[str]:
        text = self.output()
        assert text.endswith("\n")
        lines = text[:-1].split("\n")
        # Nothing that str.splitlines() takes for a line break either (\r, \x85, U+2028...).
        assert text.splitlines() == lines
        return lines


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.raw = io.BytesIO()
        # A file log: strict UTF-8, so text that cannot be encoded is a logging error here.
        super().__init__(io.TextIOWrapper(self.raw, encoding="utf-8", errors="strict", newline=""))
        self.errors: list[BaseException | None] = []

    def handleError(self, record: logging.LogRecord) -> None:
        self.errors.append(sys.exc_info()[1])


def capture(kind: str) -> Captured:
    """A fresh captured logger with the ``text`` or ``json`` formatter."""
    handler = _Handler()
    formatter: logging.Formatter = TextFormatter(TEXT_FORMAT) if kind == "text" else JsonFormatter()
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test_logs.{kind}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.handlers[:] = [handler]
    return Captured(logger, handler)


@pytest.fixture(params=["text", "json"])
def captured(request: pytest.FixtureRequest) -> Iterator[Captured]:
    result = capture(request.param)
    yield result
    result.logger.handlers[:] = []


def is_json(captured: Captured) -> bool:
    return isinstance(captured.handler.formatter, JsonFormatter)


# -- printable ------------------------------------------------------------------------


def test_printable_escapes_line_breaks_and_controls() -> None:
    assert printable("a\nERROR forged") == "a\\nERROR forged"
    assert printable("\r") == "\\r"
    assert printable("\x1b[31m") == "\\x1b[31m"
    assert printable("t\tn\x00b\x07d\x7f") == "t\\tn\\x00b\\x07d\\x7f"
    assert printable("l\u2028p\u2029n\x85") == "l\\u2028p\\u2029n\\x85"
    assert printable("bidi\u202eevil\u2066") == "bidi\\u202eevil\\u2066"


def test_printable_escapes_are_unambiguous() -> None:
    # A key holding a backslash and "n" is shown apart from a key holding a newline.
    assert printable("back\\slash\\n") == "back\\\\slash\\\\n"
    assert printable("a\\nb") != printable("a\nb")


def test_printable_keeps_format_text_and_unicode_as_they_are() -> None:
    for key in ("%s", "%(x)s", "%", "a/b", "..", "__x__", "é€😀", ""):
        assert printable(key) == key


def test_printable_replaces_lone_surrogates() -> None:
    assert printable("\ud800") == "\ufffd"
    assert printable("a\udfffb") == "a\ufffdb"
    printable("\ud83d\ude00 \udc00").encode("utf-8")  # valid UTF-8: encodes strictly


def test_printable_clips_to_the_limit_in_bytes() -> None:
    shown = printable("k" * 5000)
    assert shown == "k" * KEY_SHOWN_BYTES + "…"
    shown = printable("é" * 2500)
    assert shown == "é" * (KEY_SHOWN_BYTES // 2) + "…"
    assert printable("k" * KEY_SHOWN_BYTES) == "k" * KEY_SHOWN_BYTES
    # An escape is never cut in half.
    assert printable("ab\x1b", limit_bytes=5) == "ab…"
    assert printable("ab\x1b", limit_bytes=6) == "ab\\x1b"
    assert len(printable("\n" * 5000, limit_bytes=None)) == 10_000


# -- the job logger --------------------------------------------------------------------


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=repr)
def test_hostile_key_neither_breaks_nor_forges_a_line(captured: Captured, key: str) -> None:
    log = job_logger(captured.logger, key, "m-1")
    short = key[:10]
    calls: list[tuple[Callable[[], None], str]] = [
        (lambda: log.info("attempt %d, epoch %d", 1, 2), "attempt 1, epoch 2"),
        (lambda: log.warning("no arguments, 100% literal %s"), "no arguments, 100% literal %s"),
        (lambda: log.error("%(n)d of %(m)s", {"n": 3, "m": "x"}), "3 of x"),
        (lambda: log.debug("step %r skipped", short), f"step {short!r} skipped"),
        (lambda: log.info(ValueError("not a str")), "not a str"),
    ]
    for call, _ in calls:
        call()
    assert captured.handler.errors == []
    lines = captured.lines()
    assert len(lines) == len(calls)
    prefix = f"job {printable(key)} message m-1: "
    for line, (_, text) in zip(lines, calls, strict=True):
        if is_json(captured):
            entry = json.loads(line)
            assert entry["job_key"] == key  # the exact key, surrogates and all
            assert entry["message_id"] == "m-1"
            message = entry["message"]
        else:
            _level, name, message = line.split(" ", 2)
            assert name == captured.logger.name
        assert message == prefix + text


def test_text_line_shows_the_key_escaped() -> None:
    captured = capture("text")
    job_logger(captured.logger, "a\nERROR forged", "m\r1").info("done")
    assert captured.lines() == [
        f"INFO {captured.logger.name} job a\\nERROR forged message m\\r1: done"
    ]


def test_json_escapes_line_separators_and_keeps_exact_values() -> None:
    captured = capture("json")
    key = "l\u2028p\u2029n\x85 \ud800"
    job_logger(captured.logger, key, "m-1").info("done")
    (line,) = captured.lines()
    assert "\\u2028" in line
    assert "\\u2029" in line
    assert "\\u0085" in line
    assert "\\ud800" in line
    assert json.loads(line)["job_key"] == key


def test_record_carries_exact_fields_and_the_callers_location(captured: Captured) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    captured.logger.addHandler(Keep())
    key = "k" * 5000 + "\n"
    job_logger(captured.logger, key, "m-1").info("done %s", "now")
    (record,) = records
    assert record.job_key == key  # type: ignore[attr-defined]
    assert record.message_id == "m-1"  # type: ignore[attr-defined]
    # The key is an argument of the message, never part of its format string.
    assert key not in str(record.msg)
    assert record.funcName == "test_record_carries_exact_fields_and_the_callers_location"
    assert record.filename == "test_logs.py"


def test_a_call_extra_is_merged(captured: Captured) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    captured.logger.addHandler(Keep())
    job_logger(captured.logger, "k", "m-1").info("done", extra={"step": "a"})
    (record,) = records
    assert (record.job_key, record.step) == ("k", "a")  # type: ignore[attr-defined]


def test_a_delivery_logger_carries_its_jobs_key_once_named(captured: Captured) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    captured.logger.addHandler(Keep())
    log = job_logger(captured.logger, "?", "m-1")
    log.info("received")
    log.name_job("k\n1")
    log.info("claimed")
    assert [(r.job_key, r.message_id) for r in records] == [  # type: ignore[attr-defined]
        ("?", "m-1"),
        ("k\n1", "m-1"),
    ]
    assert captured.lines()[-1].endswith("job k\\n1 message m-1: claimed") or is_json(captured)


def test_disabled_level_formats_nothing(captured: Captured) -> None:
    captured.logger.setLevel(logging.WARNING)

    class Explodes:
        def __str__(self) -> str:
            raise AssertionError("formatted although the level is disabled")

    job_logger(captured.logger, "%s", "m-1").info("value %s", Explodes())
    assert captured.output() == ""


# -- formatters on records that do not come from a job logger --------------------------


def test_text_formatter_keeps_any_record_on_one_line(captured: Captured) -> None:
    # Modules that pass a key as a plain argument: the formatter escapes what the key holds.
    captured.logger.warning("job %s message %s: renewal failed", "a\nERROR forged\x1b", "m\ud800")
    assert captured.handler.errors == []
    (line,) = captured.lines()
    if is_json(captured):
        assert (
            json.loads(line)["message"] == "job a\nERROR forged\x1b message m\ud800: renewal failed"
        )
    else:
        assert line.endswith("job a\\nERROR forged\\x1b message m\ufffd: renewal failed")


def test_traceback_lines_are_indented_so_none_passes_for_a_record(captured: Captured) -> None:
    try:
        raise RuntimeError("boom\nERROR forged record\x1b[0m")
    except RuntimeError:
        job_logger(captured.logger, "k\n", "m-1").exception("failed")
    assert captured.handler.errors == []
    lines = captured.lines()
    if is_json(captured):
        (line,) = lines
        entry = json.loads(line)
        assert "RuntimeError: boom\nERROR forged record\x1b[0m" in entry["error"]
        return
    assert lines[0] == f"ERROR {captured.logger.name} job k\\n message m-1: failed"
    assert len(lines) > 3
    assert all(line.startswith("  ") for line in lines[1:])
    assert "  ERROR forged record\\x1b[0m" in lines


def test_configure_picks_the_formatter() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure("json", logging.DEBUG)
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        assert root.level == logging.DEBUG
        configure("text")
        assert isinstance(root.handlers[0].formatter, TextFormatter)
        assert root.level == logging.INFO
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
