"""Job identity: the effect key of a message and the document id derived from it.

The key names the *logical* operation, not the delivery: it is read from the
configured key attribute (``PUBSUB_WORKER_KEY_ATTRIBUTE``) or, when none is
configured, it is the message id. Keys are attacker-controlled input, so the
Firestore document id is never the raw key: it is the hex SHA-256 of the
namespace (``job``), the subscription and the key, each preceded by its length
in 8 bytes (:func:`document_id`), which is always a valid document id whatever
the key holds (``/``, ``..``, ``__x__``, 2 KB, lone surrogates).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from pubsub_worker._attributes import REPLAY_OF_ATTRIBUTE
from pubsub_worker._support.text import KEY_DISPLAY_BYTES, display
from pubsub_worker._support.text import raw as _raw
from pubsub_worker._support.values import quick_init
from pubsub_worker.errors import InvalidMessage

__all__ = [
    "KEY_DISPLAY_BYTES",
    "REPLAY_OF_ATTRIBUTE",
    "JobIdentity",
    "derive_identity",
    "display",
    "document_id",
    "payload_digest",
]


def document_id(subscription: str, key: str, *, namespace: str = "job") -> str:
    """The Firestore document id of a job: a hex SHA-256, never the raw key.

    ``namespace`` separates records that are not jobs of that key (for
    example a message rejected before it became a job) from the job itself.
    """
    digest = _prefix(namespace, subscription).copy()
    raw = _raw(key)
    digest.update(len(raw).to_bytes(8, "big") + raw)
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _prefix(*parts: str) -> hashlib._Hash:
    """The digest of ``parts``, each preceded by its length: what every key of a subscription
    starts from (hashed once, copied per key)."""
    digest = hashlib.sha256()
    for part in parts:
        raw = _raw(part)
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest


def payload_digest(data: bytes) -> str:
    """SHA-256 of the message data: one key with two different payloads is a conflict."""
    return hashlib.sha256(data).hexdigest()


@quick_init
@dataclass(frozen=True)
class JobIdentity:
    """Who a message is, as a job: its subscription-scoped key and document id."""

    subscription: str
    key: str
    doc_id: str
    payload_sha256: str


def derive_identity(
    *,
    subscription: str,
    message_id: str,
    attributes: Mapping[str, str],
    data: bytes,
    key_attribute: str | None,
) -> JobIdentity:
    """The job identity of a message.

    Raises :class:`InvalidMessage` when ``key_attribute`` is configured and
    the message lacks it or has it empty: falling back to the message id
    would silently process one operation twice.
    """
    if key_attribute is not None:
        key = attributes.get(key_attribute)
        if key is None:
            raise InvalidMessage(f"key attribute {key_attribute!r} is missing")
        if key == "":
            raise InvalidMessage(f"key attribute {key_attribute!r} is empty")
    else:
        key = attributes.get(REPLAY_OF_ATTRIBUTE) or message_id
    return JobIdentity(
        subscription=subscription,
        key=key,
        doc_id=document_id(subscription, key),
        payload_sha256=payload_digest(data),
    )
