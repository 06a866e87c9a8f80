"""The exceptions pubsub-worker raises, in one tree.

::

    PubSubWorkerError
    ├── ConfigError            a setting is missing or out of range (raised at start-up)
    ├── LostOwnership          this delivery no longer owns the job; stop, never ack
    │   ├── ProcessingTimeout  the job ran past MAX_PROCESSING_SECONDS and was abandoned
    │   └── ShuttingDown       the worker is draining; the job is released for another worker
    ├── PermanentError         raised by user code: the job can never succeed, send it to review
    │   ├── LimitExceeded      a message or document would exceed a production limit
    │   └── DocumentTooLarge   the job document would outgrow Firestore's 1 MiB
    ├── InvalidMessage         the message cannot become a job (missing key, payload conflict)
    ├── StoreError             the job store failed in a way that is not an ownership decision
    ├── VersionConflict        a conditional write found another version (a store raises it)
    ├── AlreadyExists          a create found the document there (a store raises it)
    ├── OutboxUnsent           a committed outbox entry could not be published yet
    ├── FailurePathUnavailable the failure path could neither publish nor record the message
    └── Unreachable            Pub/Sub or Firestore did not answer at start-up

Errors of the Google client libraries are mapped to these at the boundary
(``raise ... from exc``); user code only ever needs to catch ``PermanentError``
(to raise it) and, rarely, ``LostOwnership`` (never swallow it: it is how a
stale callback is stopped).
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "ConfigError",
    "DocumentTooLarge",
    "FailurePathUnavailable",
    "InvalidHandler",
    "InvalidMessage",
    "LimitExceeded",
    "LostOwnership",
    "OutboxUnsent",
    "PermanentError",
    "ProcessingTimeout",
    "PubSubWorkerError",
    "ShuttingDown",
    "StoreError",
    "Unreachable",
    "VersionConflict",
]


class PubSubWorkerError(Exception):
    """Base of every exception raised by pubsub-worker."""


class ConfigError(PubSubWorkerError):
    """A setting is missing, malformed or out of range.

    The message names the environment variable and what it accepts.
    """


class InvalidHandler(ConfigError, TypeError):
    """What was given as a handler cannot be one: refused when it is wrapped or served.

    A handler is ``handler(message, job)`` or ``callback(message)``, sync or
    ``async def``: a function, a method or an object with ``__call__``.
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


class LimitExceeded(PermanentError, ValueError):
    """A message the library would publish, or a value it would store, breaks a production limit.

    Pub/Sub allows at most 100 attributes per message, attribute keys of 1 to
    256 bytes that do not start with ``goog``, values up to 1024 bytes and
    10 MB per message; the emulator enforces almost none of this, so the
    library checks what it sends itself. The message says which limit.
    """


class DocumentTooLarge(PermanentError):
    """The job document would outgrow its budget under Firestore's 1 MiB document limit.

    Raised when a step's result (or an outbox entry) would not fit; the job
    goes to the failure path once, with reason ``too_large``; steps already
    committed are kept and never run again.
    """


class VersionConflict(PubSubWorkerError):
    """A conditional update found another version: someone else wrote the document.

    A custom :class:`~pubsub_worker.JobStore` raises it from ``update``.
    """


class AlreadyExists(PubSubWorkerError):
    """``create`` found the document already there. A custom store raises it from ``create``."""


class OutboxUnsent(PubSubWorkerError):
    """A committed outbox entry could not be published; the job is not completed until it is.

    The job is released without counting an attempt and the message comes
    back after a backoff; the entry is published again, with the same effect
    key, before anything else runs.
    """


class FailurePathUnavailable(PubSubWorkerError):
    """The message could be neither published for review nor recorded; it is not acked.

    It is left for a redelivery after a backoff (never a hot loop); metrics
    count it as ``failure_path_errors``.
    """
