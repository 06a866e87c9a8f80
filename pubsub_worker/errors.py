"""The exceptions pubsub-worker raises, in one tree.

::

    PubSubWorkerError
    ├── ConfigError            a setting is missing or out of range (raised at start-up)
    ├── LostOwnership          this delivery no longer owns the job; stop, never ack
    │   ├── ProcessingTimeout  the job ran past MAX_PROCESSING_SECONDS and was abandoned
    │   └── ShuttingDown       the worker is draining; the job is released for another worker
    ├── PermanentError         raised by user code: the job can never succeed, send it to review
    ├── InvalidMessage         the message cannot become a job (missing key, payload conflict)
    ├── StoreError             the job store failed in a way that is not an ownership decision
    └── Unreachable            Pub/Sub or Firestore did not answer at start-up

Errors of the Google client libraries are mapped to these at the boundary
(``raise ... from exc``); user code only ever needs to catch ``PermanentError``
(to raise it) and, rarely, ``LostOwnership`` (never swallow it: it is how a
stale callback is stopped).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InvalidMessage",
    "LostOwnership",
    "PermanentError",
    "ProcessingTimeout",
    "PubSubWorkerError",
    "ShuttingDown",
    "StoreError",
    "Unreachable",
]


class PubSubWorkerError(Exception):
    """Base of every exception raised by pubsub-worker."""


class ConfigError(PubSubWorkerError):
    """A setting is missing, malformed or out of range.

    The message names the environment variable and what it accepts.
    """


class LostOwnership(PubSubWorkerError):
    """This delivery no longer owns the job.

    Raised at the next step boundary (``job.step``, ``job.heartbeat``) when a
    newer delivery of the same message exists, when Pub/Sub answered a lease
    renewal or an ack with ``INVALID_ACK_ID``, or when a commit was rejected
    because another owner claimed the job (its epoch moved on). Whatever the
    callback computed after that point is discarded; the message is not acked
    by this delivery. Never catch and ignore it.
    """


class ProcessingTimeout(LostOwnership):
    """The job exceeded ``MAX_PROCESSING_SECONDS`` and was abandoned cooperatively.

    The job is released and counts as a failed attempt; after ``MAX_ATTEMPTS``
    it goes to the failure path.
    """


class ShuttingDown(LostOwnership):
    """The worker is shutting down; the job is released without counting an attempt."""


class PermanentError(PubSubWorkerError):
    """Raise from user code when a job can never succeed (for example a malformed payload).

    The job goes to the reviewed failure path on this attempt instead of
    being retried: it is recorded as ``failed`` with this error, the original
    message is published to ``FAILURE_TOPIC`` when one is configured, and the
    message is acked.
    """


class InvalidMessage(PubSubWorkerError):
    """The message cannot be turned into a job.

    The configured key attribute is missing or empty, or the key was already
    used for a different payload. The message goes to the failure path with
    this reason; it is never silently processed under another key.
    """


class StoreError(PubSubWorkerError):
    """The job store failed and retries were exhausted; the outcome is not an ownership decision."""


class Unreachable(PubSubWorkerError):
    """Pub/Sub or Firestore did not answer at start-up; the message says where it looked."""
