"""Structured logging: every line about a job carries its key and message id.

Library code logs through :func:`job_logger`, which puts ``job_key`` and
``message_id`` in each record, exactly as they are (attributes for
structured handlers), and starts its text with ``job KEY message ID:``.
:class:`JsonFormatter` renders one JSON object per line; ``pubsub-worker``
uses it with ``PUBSUB_WORKER_LOG_FORMAT=json``, and :class:`TextFormatter`
otherwise.

Keys are data, never format. A key is whatever a publisher put in the key
attribute: ``%s``, ``%(asctime)s``, a newline followed by a fake record,
terminal escapes, 1 KiB of text. So a key never becomes part of a format
string (it is a ``%s`` argument), and in text it is shown through
:func:`printable`: backslash escapes for newlines and control characters,
surrogates replaced, clipped. A log call about a job therefore never fails
because of its key, and no key can end a line or start a forged one. JSON
output escapes every value, and keeps the exact key in ``job_key``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import client_logs

__all__ = [
    "KEY_SHOWN_BYTES",
    "JobLogger",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "job_logger",
    "printable",
]

KEY_SHOWN_BYTES = 128
"""How much of a job key or message id the text of a log line shows (UTF-8 bytes)."""

_PREFIX = "job %s message %s: "

# What cannot appear as itself in one line of a text log: C0 and C1 control characters
# (newline, carriage return, escape, ...), DEL, the Unicode line and paragraph separators
# (line breaks to many readers), bidirectional controls (which reorder what a terminal
# shows) and lone surrogates (not encodable as UTF-8).
_UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# JSON output is written as UTF-8 text: json.dumps(ensure_ascii=False) escapes C0 controls,
# but leaves lone surrogates (which cannot be encoded: a logging error), C1 controls and
# U+2028/U+2029 (line breaks to some readers) as they are. These become \\uXXXX escapes,
# which any JSON parser turns back into the same characters.
_JSON_UNSAFE_RE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff]")


if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:  # LoggerAdapter is subscriptable at run time only from Python 3.11
    _Adapter = logging.LoggerAdapter


def _escaped(char: str, *, backslash: bool) -> str:
    if char == "\\":
        return "\\\\" if backslash else char
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    if _UNSAFE_RE.match(char):
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


def printable(text: str, limit_bytes: int | None = KEY_SHOWN_BYTES) -> str:
    """``text`` as one line of a text log may show it: no character can break the line.

    Newlines, carriage returns and tabs become ``\\n``, ``\\r``, ``\\t``;
    other control characters, line separators and bidirectional controls
    ``\\xNN`` or ``\\uNNNN``; a backslash ``\\\\`` (so the escapes are
    unambiguous); lone surrogates U+FFFD. The result is valid UTF-8, and
    clipped to ``limit_bytes`` bytes followed by ``…`` (None: not clipped).
    """
    if limit_bytes is None:
        return "".join(_escaped(char, backslash=True) for char in text)
    shown: list[str] = []
    used = 0
    # Stops after limit_bytes characters at the latest: a hostile 1 MB key costs no more.
    for char in text:
        piece = _escaped(char, backslash=True)
        size = len(piece.encode())
        if used + size > limit_bytes:
            return "".join(shown) + "…"
        shown.append(piece)
        used += size
    return "".join(shown)


def _one_line(text: str) -> str:
    # Backslashes are left alone: text that went through printable() is not escaped twice.
    return _UNSAFE_RE.sub(lambda m: _escaped(m.group(), backslash=False), text)


class _Formatted:
    """``str(msg) % args``, computed when the record is rendered (as logging would)."""

    def __init__(self, msg: object, args: object) -> None:
        self.msg = msg
        self.args = args

    def __str__(self) -> str:
        return str(self.msg) % self.args


class JobLogger(_Adapter):
    """A logger for one job: ``job_key`` and ``message_id`` on every record and in its text.

    The record keeps the exact key and message id as the attributes
    ``job_key`` and ``message_id``. Its text starts ``job KEY message ID:``
    with both shown through :func:`printable`; they are arguments of that
    prefix, never part of the format string, so a key holding ``%s`` or a
    newline can neither break the call nor forge a line. The caller's own
    message and arguments are formatted as ``logging`` always does.
    """

    def name_job(self, key: str) -> None:
        """The job's key is known now: this logger's later records carry it."""
        self.extra = {**(self.extra or {}), "job_key": key}

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Merge the job's fields into the record's ``extra`` (a call's own ``extra`` wins)."""
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg % args`` after the ``job KEY message ID:`` prefix."""
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        extra = kwargs["extra"]
        shown = (
            printable(str(extra.get("job_key"))),
            printable(str(extra.get("message_id"))),
        )
        # Report the caller, not this method: stacklevel 1 names the code that called log(),
        # info(), ... on this adapter, as it would on a Logger.
        stacklevel = kwargs.get("stacklevel", 1)
        if sys.version_info >= (3, 11):
            # 3.11 counts frames outside logging's own source: this method is one more.
            kwargs["stacklevel"] = stacklevel + 1
        else:
            kwargs["stacklevel"] = _raw_stacklevel(sys._getframe(1), stacklevel)
        if len(args) == 1 and isinstance(args[0], Mapping) and args[0]:
            # "%(name)s" style: the prefix's positional arguments cannot mix with it.
            self.logger.log(level, _PREFIX + "%s", *shown, _Formatted(msg, args[0]), **kwargs)
        elif not isinstance(msg, str):
            text = _Formatted(msg, args) if args else msg
            self.logger.log(level, _PREFIX + "%s", *shown, text, **kwargs)
        elif args:
            self.logger.log(level, _PREFIX + msg, *shown, *args, **kwargs)
        else:
            # Without arguments logging takes msg literally; with the prefix's it formats, so a
            # literal "%" in msg is doubled to come out as it was.
            self.logger.log(level, _PREFIX + msg.replace("%", "%%"), *shown, **kwargs)


# logging's own source file: the frames findCaller() passes over.
_LOGGING_SOURCE = os.path.normcase(logging.Logger.log.__code__.co_filename)


def _raw_stacklevel(caller: FrameType | None, stacklevel: int) -> int:
    """The ``stacklevel`` that names, before Python 3.11, the frame 3.11 would name.

    3.11 counts only frames outside logging's source, so ``stacklevel + 1`` passes over
    :meth:`JobLogger.log` and the adapter's ``info()`` and the like. Before 3.11,
    ``findCaller`` starts at the frame that called ``Logger.log`` (:meth:`JobLogger.log`),
    steps ``stacklevel - 1`` frames of any kind up, and only then passes over logging's
    frames; so the frame sought (the ``stacklevel``-th outside logging, from ``caller``,
    the frame that called :meth:`JobLogger.log`) is counted out here.
    """
    frame, raw, outside = caller, 1, 0
    while frame is not None:
        if os.path.normcase(frame.f_code.co_filename) != _LOGGING_SOURCE:
            outside += 1
            if outside == stacklevel:
                break
        frame, raw = frame.f_back, raw + 1
    return raw + 1


def job_logger(logger: logging.Logger, key: str, message_id: str) -> JobLogger:
    """A logger for one job: the records carry the exact key, the text shows it safely."""
    return JobLogger(logger, {"job_key": key, "message_id": message_id})


class TextFormatter(logging.Formatter):
    """``logging.Formatter`` that keeps each record on one line.

    The formatted record is passed through the escaping of :func:`printable`
    (without clipping), so a newline or control character in any message
    argument shows as an escape. An exception's traceback follows on lines
    indented by two spaces, so no line of it can pass for a record.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line, plus its indented traceback or stack if any."""
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = _one_line(self.formatMessage(record))
        # The traceback is rendered here each time, not cached on the record: another
        # handler's formatter would otherwise reuse this one's indented form.
        blocks = []
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            text += "".join("\n  " + _one_line(line) for line in block.split("\n"))
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, job_key, message_id, error.

    ``job_key`` and ``message_id`` are the exact values; every string is
    escaped as JSON, and characters some readers take for line breaks
    (U+2028, U+2029, C1 controls) and lone surrogates as ``\\uXXXX``, so a
    record is always exactly one line of valid UTF-8.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("job_key", "message_id"):
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        text = json.dumps(entry, ensure_ascii=False, default=str)
        return _JSON_UNSAFE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def configure(fmt: str = "text", level: int = logging.INFO) -> None:
    """Configure the root logger for a worker process (``text`` or ``json`` lines).

    The stock client's refused lease modacks become one counted line per
    interval instead of a traceback each (:mod:`pubsub_worker._support.client_logs`).
    """
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    client_logs.install()
