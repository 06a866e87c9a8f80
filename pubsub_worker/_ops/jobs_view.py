"""How ``pubsub-worker jobs`` presents a job: the view of its document, as text and as JSON.

:class:`JobView` is a job document as an operator reads it (status, epoch,
owner, the lease left on Firestore's clock, every step with its time and
size, the outbox and the last error; a failed job's unsent outbox entries
are marked as published on replay), built from the stored fields the way
a claim reads them; :meth:`JobView.to_json` gives it in plain JSON types.
:func:`render_job` is ``jobs show`` as text, one fact per line, and
:func:`list_row` a row of ``jobs list`` (:data:`LIST_HEADER`), which the
command lays out as a table. Every stored
string is shown through :func:`pubsub_worker._support.logs.printable`: a key cannot
forge a line or send terminal escapes. Nothing here reads or writes the
store: :mod:`pubsub_worker._ops.jobs` does.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pubsub_worker._job.lease import lease_left_s
from pubsub_worker._support.logs import printable
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, Review, Snapshot, Status

__all__ = [
    "LIST_HEADER",
    "JobView",
    "OutboxView",
    "StepView",
    "lease_text",
    "list_row",
    "render_job",
]

_STEP_AT = "at"
"""Field of a step record (``steps.{name}.at``) holding when it was committed."""
_OUTBOX_EFFECT_KEY = "effect_key"
"""Field of an outbox entry (``outbox.{id}.effect_key``) holding its effect key."""
_SHOWN = 2048
"""Bytes of an error or other long text ``jobs show`` prints."""


@dataclass(frozen=True)
class StepView:
    """One recorded step: who recorded it, when, and how large its result is."""

    name: str
    epoch: int
    at: datetime | None
    size_bytes: int
    """UTF-8 bytes of the result as stored (JSON text)."""


@dataclass(frozen=True)
class OutboxView:
    """One outbox entry: where it goes, whether it went."""

    id: str
    step: str
    topic: str
    sent: bool
    size_bytes: int
    effect_key: str | None


@dataclass(frozen=True)
class JobView:
    """A job document as an operator reads it. Times are UTC, as stored."""

    doc_id: str
    key: str | None
    subscription: str | None
    status: Status
    epoch: int
    owner: str | None
    message_id: str | None
    attempts: int
    lease_s: float | None
    lease_left_s: float | None
    """Running jobs only: seconds the owner's lease still runs on Firestore's clock (<= 0:
    lapsed). ``None`` for every other status."""
    reason: str | None
    review: str | None
    """A failed job's failure message: ``pending`` (not published yet) or ``sent``."""
    error: str | None
    steps: tuple[StepView, ...]
    outbox: tuple[OutboxView, ...]
    first_seen_at: datetime | None
    updated_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    replayed_at: datetime | None
    expire_at: datetime | None

    @classmethod
    def from_fields(
        cls,
        doc_id: str,
        fields: Mapping[str, Any],
        now: datetime,
        *,
        read_time: datetime | None = None,
        update_time: datetime | None = None,
    ) -> JobView:
        """The view of a stored document; the lease is judged like a claim judges it."""
        record = JobRecord.parse(fields)
        raw_steps = fields.get(s.STEPS) or {}
        steps = tuple(
            StepView(
                name=name,
                epoch=step.epoch,
                at=_time((raw_steps.get(name) or {}).get(_STEP_AT)),
                size_bytes=len(step.result.encode("utf-8", "surrogatepass")),
            )
            for name, step in sorted(
                record.steps.items(), key=lambda item: _sort_time(raw_steps, item[0])
            )
        )
        raw_outbox = fields.get(s.OUTBOX) or {}
        outbox = tuple(
            OutboxView(
                id=entry.id,
                step=entry.step,
                topic=entry.topic,
                sent=entry.sent,
                size_bytes=len(entry.data),
                effect_key=(raw_outbox.get(entry.id) or {}).get(_OUTBOX_EFFECT_KEY),
            )
            for entry in sorted(record.outbox.values(), key=lambda e: e.id)
        )
        left = None
        if record.status is Status.RUNNING:
            left = lease_left_s(record, now, read_time=read_time, update_time=update_time)
        return cls(
            doc_id=doc_id,
            key=record.key,
            subscription=record.subscription,
            status=record.status,
            epoch=record.epoch,
            owner=record.owner,
            message_id=record.message_id,
            attempts=record.attempts,
            lease_s=record.lease_s,
            lease_left_s=left,
            reason=record.reason,
            review=record.review,
            error=record.error,
            steps=steps,
            outbox=outbox,
            first_seen_at=_time(fields.get(s.FIRST_SEEN_AT)),
            updated_at=_time(fields.get(s.UPDATED_AT)),
            completed_at=_time(fields.get(s.COMPLETED_AT)),
            failed_at=_time(record.failed_at),
            replayed_at=_time(record.replayed_at),
            expire_at=_time(fields.get(s.EXPIRE_AT)),
        )

    @classmethod
    def from_snapshot(cls, doc_id: str, snapshot: Snapshot, now: datetime) -> JobView:
        """The view of a document read through a :class:`~pubsub_worker.stores.base.JobStore`."""
        return cls.from_fields(
            doc_id,
            snapshot.fields,
            now,
            read_time=snapshot.read_time,
            update_time=snapshot.update_time,
        )

    @property
    def unsent(self) -> tuple[OutboxView, ...]:
        """Outbox entries committed and not published yet.

        A running or released job publishes them at its next claim (before its
        handler runs) or before it completes; a failed job, when it is replayed.
        """
        return tuple(entry for entry in self.outbox if not entry.sent)

    @property
    def is_job(self) -> bool:
        """False for a message rejected before it became a job (missing key, conflict)."""
        return self.epoch > 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types: times as ISO 8601 text, the status as its value."""
        out: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name in ("steps", "outbox"):
                value = [_plain(dataclasses.asdict(part)) for part in value]
            out[item.name] = _plain(value)
        return out


def _time(value: Any) -> datetime | None:
    """A stored timestamp as an aware UTC datetime (Firestore's come back aware already)."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _sort_time(raw_steps: Mapping[str, Any], name: str) -> tuple[datetime, str]:
    at = _time((raw_steps.get(name) or {}).get(_STEP_AT))
    return (at or datetime.min.replace(tzinfo=timezone.utc), name)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# -- as text -------------------------------------------------------------------


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "-"


def lease_text(view: JobView) -> str:
    """What is left of a running job's lease on Firestore's clock, or when it lapsed; else ``-``."""
    if view.lease_left_s is None:
        return "-"
    if view.lease_left_s > 0:
        return f"{view.lease_left_s:.0f} s left"
    return f"lapsed {-view.lease_left_s:.0f} s ago"


def _size(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"


def render_job(view: JobView) -> str:
    """``jobs show`` as text: one fact per line, every stored string shown escaped."""
    key = printable(view.key, None) if view.key is not None else "(no key)"
    owner_label = "owner" if view.status is Status.RUNNING else "last owner"
    lines = [
        f"job {key}",
        f"  status       {view.status.value} (epoch {view.epoch}, attempts {view.attempts})",
        f"  {owner_label:<12} {printable(view.owner or '-')} "
        f"(message {printable(view.message_id or '-')})",
    ]
    if view.lease_left_s is not None:
        of = f" of {view.lease_s:.0f} s" if view.lease_s else ""
        lines.append(f"  lease        {lease_text(view)}{of} (Firestore's clock)")
    if view.reason:
        lines.append(f"  reason       {printable(view.reason)}")
    if view.review == Review.PENDING.value:
        lines.append(
            "  review       pending: the failure message is not published yet; the next "
            "delivery of the job's message publishes it"
        )
    elif view.review:
        lines.append(f"  review       {printable(view.review)} (the failure message is published)")
    lines += [
        f"  first seen   {_when(view.first_seen_at)}",
        f"  updated      {_when(view.updated_at)}",
    ]
    for label, value in (
        ("completed", view.completed_at),
        ("failed", view.failed_at),
        ("replayed", view.replayed_at),
    ):
        if value is not None:
            lines.append(f"  {label:<12} {_when(value)}")
    lines.append(f"  expires      {_when(view.expire_at)}")
    lines.append(f"  document     {view.doc_id}")
    lines.append(f"  steps        {len(view.steps)}" + (":" if view.steps else ""))
    width = max((len(printable(step.name)) for step in view.steps), default=0)
    for step in view.steps:
        lines.append(
            f"    {printable(step.name):<{width}}  epoch {step.epoch}  {_when(step.at)}  "
            f"{_size(step.size_bytes)}"
        )
    lines.append(f"  outbox       {len(view.outbox)}" + (":" if view.outbox else ""))
    failed = view.status is Status.FAILED
    not_sent = "NOT SENT (published on replay)" if failed else "NOT SENT"
    for entry in view.outbox:
        lines.append(
            f"    {printable(entry.id)}  step {printable(entry.step)}  -> "
            f"{printable(entry.topic)}  {_size(entry.size_bytes)}  "
            + ("sent" if entry.sent else not_sent)
        )
    if failed and view.unsent and view.is_job:
        count = len(view.unsent)
        key = shlex.quote(printable(view.key, None)) if view.key is not None else view.doc_id
        lines.append(
            f"  unsent       {count} outbox entr{'y' if count == 1 else 'ies'} of committed "
            "steps not published; published, with the same effect keys, when the job is "
            f"replayed (pubsub-worker jobs replay {key})"
        )
    lines.append(
        f"  last error   {printable(view.error, _SHOWN)}" if view.error else "  last error   -"
    )
    return "\n".join(lines)


LIST_HEADER = ("KEY", "STATUS", "EPOCH", "ATTEMPTS", "UPDATED", "LEASE", "STEPS", "ERROR")
"""The columns of ``jobs list``, one :func:`list_row` cell each."""


def list_row(view: JobView) -> tuple[str, ...]:
    """One row of ``jobs list``: every stored string escaped; keys and errors clipped."""
    return (
        printable(view.key, 40) if view.key is not None else "(no key)",
        view.status.value,
        str(view.epoch),
        str(view.attempts),
        _when(view.updated_at),
        lease_text(view),
        str(len(view.steps)),
        printable(view.error, 60) if view.error else "",
    )
