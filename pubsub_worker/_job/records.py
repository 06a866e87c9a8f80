"""Step records: their encoding, their names, and the job document's budget.

A step result is stored as JSON *text* (Firestore rejects nested arrays,
empty field names and integers beyond 64 bits; a result must come back
exactly as it went in), at most :data:`MAX_RESULT_BYTES`. Step records and
outbox entries of one job share :data:`STEPS_BUDGET_BYTES`; the rest of
Firestore's 1 MiB is kept for the job's own fields and a failed record.

**Text that is not valid UTF-8.** Firestore strings and Pub/Sub attributes
must be valid UTF-8, and a Python ``str`` need not be: ``os.fsdecode`` of a
non-UTF-8 file name holds lone surrogates (``"\\udcff"``). A write or publish
holding one fails whole, every time, so text the library did not make itself
(an error message, a reason, an original attribute) goes through
:func:`encodable_text` where it is written: each lone surrogate becomes the
visible escape ``\\udcff``, nothing is dropped. Names that identify
something (a step name, a user's own outbox message) are refused instead
(:func:`check_step_name`, :func:`pubsub_worker._job.outbox.check_outgoing`):
escaping them would change what they name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from pubsub_worker._support.limits import MAX_DOCUMENT_BYTES
from pubsub_worker._support.values import quick_init
from pubsub_worker.errors import DocumentTooLarge, PermanentError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, OutboxEntry

__all__ = [
    "MAX_RESULT_BYTES",
    "MAX_STEP_NAME_BYTES",
    "RECORD_RESERVE_BYTES",
    "STEPS_BUDGET_BYTES",
    "Budget",
    "Recorded",
    "StagedStep",
    "StepRecorder",
    "TransactionParts",
    "check_step_name",
    "encodable_text",
    "encode",
    "unencodable_at",
]

MAX_STEP_NAME_BYTES = 256
MAX_RESULT_BYTES = 256 * 1024
RECORD_RESERVE_BYTES = 160 * 1024
"""Room kept in the job document for its own fields, the error and a failed record's
original attributes (up to 100 x 1,280 bytes in production)."""
STEPS_BUDGET_BYTES = MAX_DOCUMENT_BYTES - RECORD_RESERVE_BYTES
"""Bytes the step records and outbox entries of one job may use together."""
_ENTRY_OVERHEAD_BYTES = 128  # field names, epoch, timestamps, flags of one record


@dataclass(frozen=True)
class Recorded:
    """A step's recorded result (which may be ``None``)."""

    value: Any


_SAME_AFTER_JSON = frozenset({type(None), bool, int, float, str})
"""Types whose JSON round trip gives back an equal value of the same type (exactly these,
not subclasses: an ``IntEnum`` comes back an ``int``): their text need not be decoded."""


@quick_init
@dataclass(frozen=True)
class StagedStep:
    """A step's record, staged: what is left to write now, if anything."""

    result: str
    """The result as stored (its JSON)."""
    entries: list[OutboxEntry]
    """The step's outbox entries: written now, then published."""
    write_now: bool
    """The record is written before the step returns (outbox entries, or the lease is due)."""
    returned: Any
    """What the step's function returned (``result`` is its JSON)."""

    @property
    def value(self) -> Any:
        """The step's value as a later delivery gets it back: its JSON round trip."""
        if type(self.returned) in _SAME_AFTER_JSON:
            return self.returned  # the round trip would give back an equal value
        return json.loads(self.result)


class Budget:
    """What the job document's step records and outbox entries use, against the budget."""

    def __init__(self, record: JobRecord) -> None:
        self.used = 0  # a first claim's record: nothing recorded yet
        if record.steps:
            self.used += sum(step_bytes(n, r.result) for n, r in record.steps.items())
        if record.outbox:
            self.used += sum(entry_bytes(e) for e in record.outbox.values())

    @property
    def room(self) -> int:
        """Bytes still free for a failed record's data."""
        return max(STEPS_BUDGET_BYTES - self.used, 0)

    def check(self, name: str, result: str, entries: list[OutboxEntry]) -> int:
        """Bytes step ``name`` needs; :class:`DocumentTooLarge` if they do not fit."""
        needed = step_bytes(name, result)
        if entries:
            needed += sum(entry_bytes(e) for e in entries)
        if self.used + needed > STEPS_BUDGET_BYTES:
            raise DocumentTooLarge(
                f"step {name!r} would bring the job document to about "
                f"{self.used + needed} bytes of step records and outbox entries "
                f"(budget {STEPS_BUDGET_BYTES} under Firestore's {MAX_DOCUMENT_BYTES}); "
                "store large outputs elsewhere and return their reference"
            )
        return needed

    def add(self, name: str, result: str, entries: list[OutboxEntry]) -> None:
        """Count a committed step (checked before its commit)."""
        self.used += step_bytes(name, result) + sum(entry_bytes(e) for e in entries)

    def take(self, name: str, result: str, entries: list[OutboxEntry]) -> None:
        """:meth:`check`, then :meth:`add`: the step is counted from its staging on."""
        self.used += self.check(name, result, entries)


def step_bytes(name: str, result: str) -> int:
    """About what one step record takes in the document."""
    return len(name.encode("utf-8", "surrogatepass")) + len(result.encode()) + _ENTRY_OVERHEAD_BYTES


def entry_bytes(entry: OutboxEntry) -> int:
    """About what one outbox entry takes in the document."""
    attributes = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in entry.attributes.items()
    )
    return len(entry.data) + attributes + len(entry.topic) + 2 * _ENTRY_OVERHEAD_BYTES


def encodable_text(text: str) -> str:
    """``text`` as valid UTF-8: each lone surrogate becomes the visible text ``\\udcff``.

    Everything else is unchanged (valid text is returned as it is), so the
    result can be stored in Firestore and sent as a Pub/Sub attribute, and
    applying it twice changes nothing more. The escaped text is 6 bytes per
    surrogate where the original was 3 (``surrogatepass``): a caller with a
    byte limit clips after escaping.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def unencodable_at(text: str) -> int | None:
    """Index of the first character of ``text`` that UTF-8 cannot encode (a lone surrogate)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


_VALID_NAMES: set[str] = set()
"""Step names found valid: a worker's handlers name the same few steps in every job, checked
once each (cleared past :data:`_VALID_NAMES_KEPT`, so names made per job cost no memory)."""
_VALID_NAMES_KEPT = 1024


def check_step_name(name: str) -> None:
    """``ValueError`` unless ``name`` is a non-empty string of at most 256 UTF-8 bytes.

    A name holding a lone surrogate is refused: it names the step's record in
    the job document, which Firestore would refuse, and escaping it would
    name another step.
    """
    try:
        if name in _VALID_NAMES:
            return
    except TypeError:  # not hashable: not a string, refused below
        pass
    _check_new_step_name(name)
    if len(_VALID_NAMES) >= _VALID_NAMES_KEPT:
        _VALID_NAMES.clear()
    _VALID_NAMES.add(name)


def _check_new_step_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("a step name is a non-empty string")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_STEP_NAME_BYTES:
        raise ValueError(f"step names are at most {MAX_STEP_NAME_BYTES} bytes")
    at = unencodable_at(name)
    if at is not None:
        raise ValueError(
            f"step name {name!r} is not valid UTF-8 (a lone surrogate at index {at}, as "
            "os.fsdecode makes of undecodable bytes); Firestore cannot store it: "
            "escape it, e.g. name.encode('utf-8', 'backslashreplace').decode()"
        )


_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
"""A step result's encoder, made once (``json.dumps`` with options makes one per call). Its
text is ASCII: every other character escaped, so its length is its size in bytes."""


def encode(step: str, value: Any) -> str:
    """The JSON text of a step result; :class:`PermanentError` when it is not JSON or too big."""
    kind = type(value)
    if value is None or kind is bool:
        return "null" if value is None else ("true" if value else "false")
    try:  # an int as the encoder writes it, without building an encoder per call
        text = int.__repr__(value) if kind is int else _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:  # ValueError: an int of more digits than str() allows
        raise PermanentError(f"the result of step {step!r} is not JSON: {exc}") from exc
    if len(text) > MAX_RESULT_BYTES:  # ASCII (the encoder escapes the rest): a byte each
        raise DocumentTooLarge(
            f"the result of step {step!r} is {len(text)} bytes; at most {MAX_RESULT_BYTES} "
            "are recorded (store large outputs elsewhere and return their reference)"
        )
    return text


class StepRecorder(Protocol):
    """What :class:`TransactionParts` needs of the job."""

    @property
    def epoch(self) -> int: ...

    def outbox_changes(self, step: str) -> tuple[dict[tuple[str, ...], Any], list[OutboxEntry]]: ...

    def check_budget(self, name: str, result: str, entries: list[OutboxEntry]) -> None: ...

    def step_record(self, result: str) -> dict[str, Any]: ...


class TransactionParts:
    """The job side of one transactional step: its changes, and adopting a lost reply."""

    def __init__(self, job: StepRecorder, name: str) -> None:
        self.name = name
        self.result = ""
        self.committed: list[OutboxEntry] = []
        """The outbox entries of the attempt that commits."""
        self._job = job

    def changes(self, value: Any) -> dict[tuple[str, ...], Any]:
        """The step record and outbox entries of the attempt that returned ``value``."""
        job = self._job
        self.result = encode(self.name, value)
        outbox, self.committed = job.outbox_changes(self.name)
        job.check_budget(self.name, self.result, self.committed)
        return {(s.STEPS, self.name): job.step_record(self.result), **outbox}

    def adopt(self, record: JobRecord) -> bool:
        """True if ``record`` shows this step committed at our epoch (a reply that was lost)."""
        done = record.steps.get(self.name)
        if done is None or done.epoch != self._job.epoch:
            return False
        self.result = done.result
        self.committed = [e for e in record.outbox.values() if e.step == self.name and not e.sent]
        return True
