"""Transcode a claims attachment once per operation id, whatever Pub/Sub redelivers.

The message: JSON ``{"claim_id", "filename", "content_b64"}`` with the
attribute ``operation_id``, the effect key. For each operation the worker:

1. parses the attachment; a malformed one can never succeed, so it raises
   ``PermanentError`` and goes to the reviewed failure path (failure topic
   plus a ``failed`` job record) instead of being retried;
2. transcodes it in chunks, reporting progress (``job.heartbeat()``) per
   chunk: the lease is renewed only while chunks keep coming, so a stalled
   worker's job is recovered by another one;
3. in one transactional step, stores the output (a Firestore document keyed
   by the operation id) and queues the "transcoded" message in the job's
   outbox; the message is published after that commit.

When the callback returns, the wrapper records the job completed and only
then acks. A redelivery of a completed operation is acked without running
anything, so the output is stored and announced once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.cloud import firestore

import pubsub_worker

__all__ = [
    "CARD",
    "Attachment",
    "card_settings",
    "main",
    "make_handler",
    "output_id",
    "parse",
    "transcode",
]

CARD: dict[str, Any] = {
    "key_attribute": "operation_id",  # the effect key: never a new one on redelivery
    "lease_seconds": 150,  # visibility to start with, chosen from measured durations
    "max_processing_seconds": 480,  # total cap: 8 minutes, then abandoned cooperatively
    "max_attempts": 5,  # a job failing this often goes to the failure path
}
"""The operational card's settings (``PUBSUB_WORKER_*`` variables override them)."""

CHUNK_BYTES = 64 * 1024
MAX_ATTACHMENT_BYTES = 512 * 1024  # the output must fit in one Firestore document (1 MiB)
OUTPUT_TOPIC = "attachments-transcoded"
OUTPUT_COLLECTION = "attachment_outputs"


@dataclass(frozen=True)
class Attachment:
    """A parsed attachment."""

    claim_id: str
    filename: str
    content: bytes


def parse(data: bytes) -> Attachment:
    """The attachment in a message; ``PermanentError`` if it can never be transcoded."""
    try:
        fields = json.loads(data)
    except ValueError as exc:  # also bad UTF-8
        raise pubsub_worker.PermanentError(f"attachment is not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise pubsub_worker.PermanentError("attachment is not a JSON object")
    missing = [name for name in ("claim_id", "filename", "content_b64") if name not in fields]
    if missing:
        raise pubsub_worker.PermanentError(f"attachment lacks {', '.join(missing)}")
    try:
        content = base64.b64decode(fields["content_b64"], validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise pubsub_worker.PermanentError(f"attachment content is not base64: {exc}") from exc
    if len(content) > MAX_ATTACHMENT_BYTES:
        raise pubsub_worker.PermanentError(
            f"attachment is {len(content)} bytes; this worker takes at most {MAX_ATTACHMENT_BYTES}"
        )
    return Attachment(str(fields["claim_id"]), str(fields["filename"]), content)


def transcode(content: bytes, on_chunk: Callable[[], None]) -> bytes:
    """Compress ``content`` with zlib, chunk by chunk (the stand-in for a real codec).

    Deterministic, so a redelivery that runs it again produces the same bytes.
    ``on_chunk`` is called after every chunk: ``job.heartbeat`` there renews the
    lease while the work progresses, and raises ``LostOwnership`` as soon as
    another worker owns the job, which stops a stale transcode early.
    """
    compressor = zlib.compressobj(level=9)
    out = bytearray()
    for start in range(0, len(content), CHUNK_BYTES):
        out += compressor.compress(content[start : start + CHUNK_BYTES])
        on_chunk()
    out += compressor.flush()
    return bytes(out)


def output_id(operation_id: str) -> str:
    """The output document id: a hash, because the operation id is caller input."""
    return hashlib.sha256(operation_id.encode("utf-8", "surrogatepass")).hexdigest()


def make_handler(
    outputs: firestore.CollectionReference, output_topic: str
) -> Callable[[Any, pubsub_worker.Job], None]:
    """The callback: ``handle(message, job)``, to wrap with ``pubsub_worker.exactly_once``."""

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        attachment = parse(message.data)
        # Outside any step: pure computation, safe to repeat after a crash.
        transcoded = transcode(attachment.content, on_chunk=job.heartbeat)
        digest = hashlib.sha256(transcoded).hexdigest()

        def store_and_announce(transaction: firestore.Transaction) -> dict[str, str]:
            # One transaction: the output, the step record and the outbox entry commit
            # together, and only if this worker still owns the job (its epoch).
            ref = outputs.document(output_id(job.key))
            transaction.set(
                ref,
                {
                    "operation_id": job.key,
                    "claim_id": attachment.claim_id,
                    "filename": attachment.filename,
                    "original_bytes": len(attachment.content),
                    "content": transcoded,
                    "encoding": "zlib",
                    "sha256": digest,
                    "epoch": job.epoch,
                },
            )
            announcement = {
                "operation_id": job.key,
                "claim_id": attachment.claim_id,
                "output": ref.path,
                "bytes": len(transcoded),
                "sha256": digest,
            }
            # Published after the commit, with an `effect_key` attribute downstream dedupes on.
            job.publish(output_topic, json.dumps(announcement).encode(), operation_id=job.key)
            return {"output": ref.path, "sha256": digest}

        job.transactional_step("store_output", store_and_announce)
        # Returning means done: the wrapper records the completion, then acks.

    return handle


def card_settings(**values: Any) -> pubsub_worker.Settings:
    """Settings from the environment, with the card's values where it says nothing."""
    card = {name: value for name, value in CARD.items() if _env_name(name) not in os.environ}
    return pubsub_worker.Settings.from_env(**{**card, **values})


def _env_name(setting: str) -> str:
    return f"PUBSUB_WORKER_{setting.upper()}"


def main() -> int:
    """Run the worker until SIGTERM/SIGINT (``python -m samples.attachment_worker``).

    Besides the ``PUBSUB_WORKER_*`` settings, ``ATTACHMENT_OUTPUT_TOPIC`` and
    ``ATTACHMENT_OUTPUT_COLLECTION`` say where outputs go.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = card_settings()
    client = firestore.Client(project=settings.project_id)
    outputs = client.collection(os.environ.get("ATTACHMENT_OUTPUT_COLLECTION", OUTPUT_COLLECTION))
    topic = os.environ.get("ATTACHMENT_OUTPUT_TOPIC", OUTPUT_TOPIC)
    return pubsub_worker.run(
        make_handler(outputs, topic), settings=settings, firestore_client=client
    )
