"""Structured logging: every line about a job carries its key and message id.

Library code logs through :func:`job_logger`, which puts ``job_key`` and
``message_id`` in each record (as attributes for structured handlers and as
a prefix of the text). :class:`JsonFormatter` renders one JSON object per
line; ``pubsub-worker`` uses it with ``PUBSUB_WORKER_LOG_FORMAT=json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .keys import display

__all__ = ["JobLogger", "JsonFormatter", "configure", "job_logger"]

_KEY_SHOWN_BYTES = 128


if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:  # LoggerAdapter is subscriptable at run time only from Python 3.11
    _Adapter = logging.LoggerAdapter


class JobLogger(_Adapter):
    """Adds ``job_key`` and ``message_id`` to every record and to its text."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"job {extra['job_key']} message {extra['message_id']}: {msg}", kwargs


def job_logger(logger: logging.Logger, key: str, message_id: str) -> JobLogger:
    """A logger for one job; the key is shown safely (valid UTF-8, clipped)."""
    return JobLogger(logger, {"job_key": display(key, _KEY_SHOWN_BYTES), "message_id": message_id})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, job_key, message_id, error."""

    def format(self, record: logging.LogRecord) -> str:
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
        return json.dumps(entry, ensure_ascii=False)


def configure(fmt: str = "text", level: int = logging.INFO) -> None:
    """Configure the root logger for a worker process (``text`` or ``json`` lines)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
