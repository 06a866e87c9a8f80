"""What the owner's last write sets: a job completed, released or failed.

Each is a map of changes for :meth:`~pubsub_worker._job.fencing.FencedDocument.write`,
made here from what the worker knows at that point; the write itself, fenced
on the owner's version, is the document's. Text the library did not make
itself (an error, a reason, an original attribute) is stored made valid UTF-8
(:func:`~pubsub_worker._job.records.encodable_text`): a text holding a lone
surrogate would make the write fail every time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Status

from .records import encodable_text

__all__ = ["Changes", "completed", "failed", "released"]

Changes = dict[tuple[str, ...], Any]

_COMPLETED: str = Status.COMPLETED.value  # read once: an enum member's value is a property


def completed(now: datetime, retention_s: float) -> Changes:
    """Status ``completed`` at ``now``, the record kept ``retention_s`` for a TTL policy."""
    return {
        (s.STATUS,): _COMPLETED,
        (s.COMPLETED_AT,): now,
        (s.LEASE_EXPIRES_AT,): None,
        (s.EXPIRE_AT,): now + timedelta(seconds=retention_s),
    }


def released(now: datetime, error: str | None, attempts: int) -> Changes:
    """Status ``released`` (given back for another delivery), ``attempts`` claims counted."""
    return {
        (s.STATUS,): Status.RELEASED.value,
        (s.LEASE_EXPIRES_AT,): now,
        (s.ERROR,): encodable_text(error) if error is not None else None,
        (s.ATTEMPTS,): attempts,
    }


def failed(
    now: datetime, *, reason: str, error: str, extra: Mapping[str, Any], retention_s: float
) -> Changes:
    """The failed record of the failure path, with ``extra`` fields (the original message)."""
    changes: Changes = {
        (s.STATUS,): Status.FAILED.value,
        (s.REASON,): encodable_text(reason),
        (s.ERROR,): encodable_text(error),
        (s.FAILED_AT,): now,
        (s.LEASE_EXPIRES_AT,): None,
        (s.EXPIRE_AT,): now + timedelta(seconds=retention_s),
    }
    changes.update(
        {
            (name,): encodable_text(value) if isinstance(value, str) else value
            for name, value in extra.items()
        }
    )
    return changes
