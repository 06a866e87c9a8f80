"""How the dashboard's templates show values: times, ages, sizes, keys. Pure.

Every stored string reaches a page through Jinja's autoescaping; keys, errors
and attributes also go through :func:`~pubsub_worker._support.logs.printable`
(control characters escaped, clipped), as on the command line.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pubsub_worker._ops.jobs_view import JobView, lease_text
from pubsub_worker._support.logs import printable

__all__ = ["FILTERS", "age", "key_text", "size", "when"]


def when(value: datetime | None) -> str:
    """``2026-12-01 09:35:37 UTC``, or ``-``."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "-"


def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago: ``42 s``, ``3 min``, ``5 h 20 min``, ``2 d 4 h``; ``-`` for None."""
    if value is None:
        return "-"
    seconds = max(((now or datetime.now(timezone.utc)) - value).total_seconds(), 0.0)
    return duration(seconds)


def duration(seconds: float) -> str:
    """A duration in the two largest units that matter."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s < 600 and s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    days, hours = s // 86400, s % 86400 // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def size(value: int | None) -> str:
    """``74 B``, ``1.5 KiB``, ``2.0 MiB``; ``-`` for None."""
    if value is None:
        return "-"
    if value < 1024:
        return f"{value} B"
    if value < 1024 * 1024:
        return f"{value / 1024:.1f} KiB"
    return f"{value / 1024 / 1024:.1f} MiB"


def key_text(value: str | None, limit: int = 96) -> str:
    """A key (or any stored text) as one safe line, clipped; ``(no key)`` for None."""
    return printable(value, limit) if value is not None else "(no key)"


def text(value: Any, limit: int | None = 4096) -> str:
    """A stored text, escaped to one line per line and clipped; ``-`` when empty."""
    if not value:
        return "-"
    return "\n".join(printable(line, limit) for line in str(value).splitlines())


def lease(view: JobView) -> str:
    """What is left of a running job's lease, on Firestore's clock."""
    return lease_text(view)


FILTERS: dict[str, Any] = {
    "when": when,
    "age": age,
    "size": size,
    "key": key_text,
    "text": text,
    "lease": lease,
    "duration": duration,
}
"""The Jinja filters of every template."""
