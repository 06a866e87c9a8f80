"""The outbox: messages a step publishes, committed with the step and published after it.

Pure functions for an entry's id, its effect key and its stamped
attributes, and :class:`Outbox`, a job's entries waiting to be published.
An entry is written to the job document in its step's commit with
``sent: false``, published after the commit with the effect key
``{key}:{step}:{n}`` in ``OUTBOX_KEY_ATTRIBUTE`` and the step name in
``pubsub_worker_step``, and marked sent in the job's next write. A consumer
keyed on the effect key drops a republished copy.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pubsub_worker._attributes import LIBRARY_ATTRIBUTE_PREFIX, STEP_ATTRIBUTE
from pubsub_worker._support.limits import MAX_ATTRIBUTE_VALUE_BYTES, check_message
from pubsub_worker._support.metrics import Counter
from pubsub_worker.errors import LimitExceeded, OutboxUnsent
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import OutboxEntry

from .records import unencodable_at

if TYPE_CHECKING:
    from .context import JobContext

__all__ = [
    "MAX_OUTBOX_DATA_BYTES",
    "Outbox",
    "Outgoing",
    "effect_key",
    "entry_changes",
    "escape",
    "reserved_attribute",
]

MAX_OUTBOX_DATA_BYTES = 256 * 1024
"""An outbox message is stored in the job document: its data is kept small."""


def escape(part: str) -> str:
    """``%`` and ``:`` percent-encoded, so ``key:step`` joins are unambiguous.

    Keys and step names without those characters are unchanged; with them,
    key ``a:b`` + step ``c`` and key ``a`` + step ``b:c`` no longer meet.
    """
    return part.replace("%", "%25").replace(":", "%3A")


def reserved_attribute(name: str, outbox_key_attribute: str) -> bool:
    """Whether ``name`` is set by the library on the messages it publishes."""
    return name == outbox_key_attribute or name.startswith(LIBRARY_ATTRIBUTE_PREFIX)


def effect_key(key: str, step: str, index: int) -> str:
    """``{key}:{step}:{index}``, escaped; hashed when it would not fit an attribute value.

    Hashed too (``sha256:`` and 64 hex digits) when the key holds a lone
    surrogate, which no attribute value can carry: the hash of its
    ``surrogatepass`` bytes keeps two such keys apart, where escaping the
    surrogate could make one meet a key that holds that escape as text.
    """
    text = f"{escape(key)}:{escape(step)}:{index}"
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_ATTRIBUTE_VALUE_BYTES or unencodable_at(text) is not None:
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    return text


@dataclass(frozen=True)
class Outgoing:
    """A message a step asked to publish, before it is committed."""

    topic: str
    data: bytes
    attributes: dict[str, str]


def check_outgoing(outgoing: Outgoing, outbox_key_attribute: str) -> None:
    """Raise :class:`LimitExceeded` if the message cannot be published as asked.

    Checked when ``job.publish()`` is called, so the mistake surfaces in the
    step that made it, with the stamped attributes counted against Pub/Sub's
    limits (a limit error after the commit would leave an entry that can
    never be sent). A topic, attribute key or attribute value that is not
    valid UTF-8 (a lone surrogate, as ``os.fsdecode`` makes of undecodable
    bytes) is refused too, never changed: Firestore could not store the
    entry nor Pub/Sub carry the message, and the consumer would not get what
    was published.
    """
    _check_encodable(outgoing)
    if len(outgoing.data) > MAX_OUTBOX_DATA_BYTES:
        raise LimitExceeded(
            f"outbox messages are limited to {MAX_OUTBOX_DATA_BYTES} bytes of data "
            f"(got {len(outgoing.data)}): they are stored in the job document"
        )
    taken = sorted(a for a in outgoing.attributes if reserved_attribute(a, outbox_key_attribute))
    if taken:
        raise LimitExceeded(
            f"attribute(s) {', '.join(map(repr, taken))} are set by pubsub-worker on outbox "
            f"messages ({outbox_key_attribute!r} and {LIBRARY_ATTRIBUTE_PREFIX}*); rename them"
        )
    stamped = {**outgoing.attributes, outbox_key_attribute: "x", STEP_ATTRIBUTE: "x"}
    check_message(outgoing.data, stamped)


def _check_encodable(outgoing: Outgoing) -> None:
    texts = [("topic", outgoing.topic)]
    for name, value in outgoing.attributes.items():
        texts += [("attribute key", name), (f"value of attribute {_shown(name)}", value)]
    for what, text in texts:
        at = unencodable_at(text)
        if at is not None:
            raise LimitExceeded(
                f"outbox message: {what} {_shown(text)} is not valid UTF-8 (a lone surrogate at "
                f"index {at}, as os.fsdecode makes of undecodable bytes); Pub/Sub and "
                "Firestore refuse it: encode the text first, e.g. "
                "text.encode('utf-8', 'backslashreplace').decode()"
            )


def _shown(text: str, chars: int = 40) -> str:
    """``text`` for an error message: through ``repr`` (surrogates escaped), clipped."""
    return repr(text[:chars]) + ("…" if len(text) > chars else "")


def entry_changes(
    key: str, step: str, outgoing: list[Outgoing], outbox_key_attribute: str
) -> tuple[dict[tuple[str, ...], Any], list[OutboxEntry]]:
    """The job-document writes of a step's outbox entries, and the entries themselves."""
    changes: dict[tuple[str, ...], Any] = {}
    entries: list[OutboxEntry] = []
    for index, message in enumerate(outgoing):
        entry_id = hashlib.sha256(f"{step}\0{index}".encode("utf-8", "surrogatepass")).hexdigest()
        entry_id = entry_id[:32]
        effect = effect_key(key, step, index)
        stamped = {
            **message.attributes,
            outbox_key_attribute: effect,
            STEP_ATTRIBUTE: _clip(step),
        }
        changes[(s.OUTBOX, entry_id)] = {
            "topic": message.topic,
            "data": message.data,
            "attributes": stamped,
            "step": step,
            "effect_key": effect,
            "sent": False,
        }
        entries.append(OutboxEntry(entry_id, message.topic, message.data, stamped, step, False))
    return changes, entries


class Outbox:
    """A job's committed entries not yet published, and the loop that publishes them."""

    def __init__(
        self, entries: list[OutboxEntry], context: JobContext, log: logging.LoggerAdapter[Any]
    ) -> None:
        self._unsent = list(entries)
        self._ctx = context
        self._log = log

    @property
    def pending(self) -> int:
        """Entries committed and not published yet."""
        return len(self._unsent)

    def add(self, entries: list[OutboxEntry]) -> None:
        """Entries whose commit is durable: they may be published now."""
        self._unsent.extend(entries)

    def send(
        self,
        key: str,
        *,
        before_each: Callable[[], None],
        sent: Callable[[OutboxEntry], None],
    ) -> None:
        """Publish every pending entry in order; :class:`OutboxUnsent` at the first failure.

        ``before_each`` may raise (ownership lost) to stop; ``sent(entry)``
        stages the entry's ``sent`` mark for the job's next write.
        """
        while self._unsent:
            entry = self._unsent[0]
            before_each()
            self._ctx.hooks.before_publish(key, entry.step, entry.id)
            try:
                future = self._ctx.publish(entry.topic, entry.data, entry.attributes)
                message_id = future.result(timeout=self._ctx.io_timeout_s)
            except Exception as exc:
                self._ctx.metrics.inc(Counter.OUTBOX_ERRORS)
                raise OutboxUnsent(
                    f"outbox entry of step {entry.step!r} to {entry.topic} not published: {exc}"
                ) from exc
            self._ctx.metrics.inc(Counter.OUTBOX_PUBLISHED)
            self._log.info(
                "published outbox entry of step %r to %s as %s", entry.step, entry.topic, message_id
            )
            self._ctx.hooks.after_publish(key, entry.step, entry.id)
            sent(entry)
            self._unsent.pop(0)


def unsent(outbox: Mapping[str, OutboxEntry]) -> list[OutboxEntry]:
    """Entries committed but not marked sent, by entry id: the same order on every store.

    Not the map's own order: the memory store keeps the order entries were written in,
    Firestore returns a map's fields in an order of its own.
    """
    return sorted((entry for entry in outbox.values() if not entry.sent), key=lambda e: e.id)


def _clip(text: str) -> str:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_ATTRIBUTE_VALUE_BYTES:
        return text
    return raw[:MAX_ATTRIBUTE_VALUE_BYTES].decode("utf-8", "ignore")
