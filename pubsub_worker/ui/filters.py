"""The job list's filters, read from a page's query string. Pure: nothing here does I/O.

``status``, ``reason`` (of a failed job), ``since`` and ``until`` (the last
write, UTC), ``prefix`` (of the key) and ``after`` (the cursor of ``jobs
list``). Status, reason and ``until`` go into the indexed query; ``since``
ends the listing where it passes; the prefix narrows its rows
(:mod:`pubsub_worker.ui.jobs`). A value that is not one of these is refused
with :class:`BadFilter`, which names the parameter and what it accepts.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from urllib.parse import urlencode

from pubsub_worker._ops.job_counts import FAILURE_REASONS
from pubsub_worker._ops.jobs import decode_cursor
from pubsub_worker._ops.jobs_view import JobView
from pubsub_worker.stores.base import Status

__all__ = ["BadFilter", "Filters", "parse_time"]

_TIME_FORMATS = ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")
_PREFIX_MAX = 1024


class BadFilter(ValueError):
    """A filter value the job list does not accept; the message says which and why."""


def parse_time(name: str, text: str) -> datetime | None:
    """A UTC time from ``YYYY-MM-DD``, ``YYYY-MM-DDTHH:MM[:SS]`` or with a space; "" is None."""
    text = text.strip()
    if not text:
        return None
    for fmt in (*_TIME_FORMATS, "%Y-%m-%d"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise BadFilter(f"{name}={text!r}: expected a UTC time like 2026-12-01T09:30 or 2026-12-01")


@dataclass(frozen=True)
class Filters:
    """What the job list shows: every field optional."""

    status: Status | None = None
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    prefix: str = ""
    after: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Filters:
        """The filters of a query string; :class:`BadFilter` for a value not accepted."""
        status_text = params.get("status", "").strip()
        try:
            status = Status(status_text) if status_text else None
        except ValueError:
            accepted = ", ".join(s.value for s in Status)
            raise BadFilter(f"status={status_text!r}: expected one of {accepted}") from None
        reason = params.get("reason", "").strip() or None
        if reason is not None:
            if reason not in FAILURE_REASONS:
                raise BadFilter(f"reason={reason!r}: expected one of {', '.join(FAILURE_REASONS)}")
            if status is not Status.FAILED:
                raise BadFilter("reason: only with status=failed (a failed job's reason)")
        since = parse_time("since", params.get("since", ""))
        until = parse_time("until", params.get("until", ""))
        if since is not None and until is not None and since >= until:
            raise BadFilter("since must be before until")
        prefix = params.get("prefix", "")
        if len(prefix.encode("utf-8", "surrogatepass")) > _PREFIX_MAX:
            raise BadFilter(f"prefix: at most {_PREFIX_MAX} bytes (stored keys are clipped there)")
        after = params.get("after", "").strip() or None
        if after is not None:
            try:
                decode_cursor(after)
            except ValueError as exc:
                raise BadFilter(f"after: {exc}") from None
        return cls(status, reason, since, until, prefix, after)

    def matches(self, view: JobView) -> bool:
        """Whether a listed row has the key prefix (every row does without one)."""
        return not self.prefix or (view.key is not None and view.key.startswith(self.prefix))

    def params(self, **changes: object) -> dict[str, str]:
        """The query parameters of these filters (with ``changes``), empty ones left out."""
        chosen = replace(self, **changes)  # type: ignore[arg-type]
        values = {
            "status": chosen.status.value if chosen.status else "",
            "reason": chosen.reason or "",
            "since": _text(chosen.since),
            "until": _text(chosen.until),
            "prefix": chosen.prefix,
            "after": chosen.after or "",
        }
        return {name: value for name, value in values.items() if value}

    def query(self, **changes: object) -> str:
        """:meth:`params` as a query string."""
        return urlencode(self.params(**changes))

    @property
    def filtered(self) -> bool:
        """Whether any filter but the cursor is set."""
        return bool(self.params(after=None))

    def cli(self) -> str | None:
        """The same page as a ``pubsub-worker jobs list`` command, when it can say it."""
        if self.reason or self.since or self.until or self.prefix:
            return None
        words = ["pubsub-worker", "jobs", "list"]
        if self.status:
            words += ["--status", self.status.value]
        if self.after:
            words += ["--after", self.after]
        return shlex.join(words)


def _text(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S") if value is not None else ""
