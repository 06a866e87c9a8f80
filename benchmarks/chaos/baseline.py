"""The baseline: what a team writes without this library (``python -m benchmarks.chaos.baseline``).

The pattern the Pub/Sub maintainers point to for long or crash-prone work
(python-pubsub#593): the stock ``SubscriberClient.subscribe`` on an
exactly-once subscription, the ack awaited with ``ack_with_response()``,
and a create-only Firestore document per message id (the *marker*) that a
redelivery finds. The callback does the chaos handler's work
(:mod:`benchmarks.chaos.handler`), with the same effects in the same
places, so the run counts both the same way (each delivery first appends a
``begin`` effect line, and a finished job a ``done`` or ``failed`` one):

1. ``prepare``: sleeps ``prepare_ms``, appends a ``prepare`` effect line
   (a poison job raises :class:`PoisonJob` here instead);
2. ``record``: the business write, a new document with an id of its own in
   ``CHAOS_SINK_COLLECTION`` (the id is drawn once per run of the callback,
   so a client retry of the same write lands on the same document, and only
   a second run of the work writes a second one);
3. ``emit``: sleeps ``emit_ms``, publishes the job's output to
   ``CHAOS_OUTPUT_TOPIC``. A plain publish: its ``effect_key`` attribute is
   new for each publish, as nothing ties a second publish of the output to
   the first.

Where the marker goes (``CHAOS_BASELINE``):

``before``  create the marker first; if it exists, the message is taken:
            ack it and skip. Then the work, then the ack. On an error the
            callback deletes its marker (so that the redelivery runs the job)
            and nacks.
``after``   read the marker first; if it exists, the job is done: ack and
            skip. Then the work, then create the marker, then the ack. On an
            error it nacks (no marker: the redelivery runs the work again).

A poison job is published to ``PUBSUB_WORKER_FAILURE_TOPIC`` (attribute
``job``) and acked, its marker created (``after``) or kept (``before``).

Done carefully, as a competent team would: every Firestore call has a 3 s
timeout (``CHAOS_RPC_TIMEOUT_S``) and retries transient errors with
backoff for 30 s (the library's store does the same); the marker holds a
token of the callback that created it, so a create retried after a lost
reply is recognised as its own, not as a redelivery; the lease is the
library's (``PUBSUB_WORKER_LEASE_SECONDS``, the client's lease extension
set to it, not its exactly-once floor of 60 s) and so is the number of
messages in flight (``PUBSUB_WORKER_MAX_MESSAGES``).

Environment: ``GOOGLE_CLOUD_PROJECT``, the emulator hosts, and from the
run's worker environment ``PUBSUB_WORKER_SUBSCRIPTION``,
``PUBSUB_WORKER_FAILURE_TOPIC``, ``PUBSUB_WORKER_LEASE_SECONDS``,
``PUBSUB_WORKER_MAX_MESSAGES``, ``CHAOS_EFFECTS``, ``CHAOS_SINK_COLLECTION``,
``CHAOS_OUTPUT_TOPIC``, ``CHAOS_STATS``, ``CHAOS_BASELINE``,
``CHAOS_MARKER_COLLECTION`` (the markers: document id = message id, fields
``job``, ``token``, ``pid``, ``state``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeAlias

from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.cloud import firestore, pubsub_v1
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError

__all__ = ["MARKER_COLLECTION", "VARIANTS", "PoisonJob", "main"]

VARIANTS = ("before", "after")
"""Where the marker is written: before the work or after it."""
MARKER_COLLECTION = "CHAOS_MARKER_COLLECTION"
"""The environment variable naming the markers' collection."""

ACK_TIMEOUT_S = 60.0
PUBLISH_TIMEOUT_S = 60.0
STATS_INTERVAL_S = 0.5

_LOGGER = logging.getLogger("benchmarks.chaos.baseline")
_Log: TypeAlias = "logging.LoggerAdapter[logging.Logger]"
"""A logger whose records carry the job key and the message id."""
_TRANSIENT = retries.if_exception_type(
    gexc.DeadlineExceeded,
    gexc.ServiceUnavailable,
    gexc.InternalServerError,
    gexc.Unknown,
    gexc.Aborted,
    gexc.ResourceExhausted,
)
RETRY = retries.Retry(predicate=_TRANSIENT, initial=0.05, maximum=2.0, multiplier=2.0, timeout=30)
"""Transient Firestore errors are retried with backoff for 30 s, as the library's store does."""


class PoisonJob(Exception):
    """The job can never succeed: it goes to the failure topic, not back to Pub/Sub."""


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


class _JsonLines(logging.Formatter):
    """One JSON object per record (the run counts log lines by level)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name in ("job", "message_id"):
            if hasattr(record, name):
                line[name] = getattr(record, name)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


@dataclass
class _Clients:
    firestore: firestore.Client
    publisher: pubsub_v1.PublisherClient
    markers: str
    sink: str
    output_topic: str
    failure_topic: str
    rpc_timeout_s: float


class Baseline:
    """The callback of one baseline worker process, and its counters (thread-safe)."""

    def __init__(self, variant: str, clients: _Clients) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"CHAOS_BASELINE={variant!r}: expected one of {VARIANTS}")
        self.variant = variant
        self._clients = clients
        self._lock = threading.Lock()  # guards counts
        self.counts: Counter[str] = Counter()

    def count(self, name: str) -> None:
        """Add one to counter ``name``."""
        with self._lock:
            self.counts[name] += 1

    # -- the callback -------------------------------------------------------------------

    def __call__(self, message: Any) -> None:
        """Handle one delivery: marker, work and ack in the variant's order; never raises."""
        key = str(message.attributes.get("job", ""))
        log = logging.LoggerAdapter(_LOGGER, {"job": key, "message_id": message.message_id})
        self.count("received")
        # First of all, as the library's handler does on starting a delivery: a job a
        # killed worker had begun is then every job whose marker it may have written.
        _effect("begin", key)
        marker = self._clients.firestore.collection(self._clients.markers).document(
            message.message_id
        )
        token = uuid.uuid4().hex
        try:
            if self.variant == "before":
                if not self._take(marker, key, token):
                    self.count("skipped")
                    log.info("marker exists: the message is taken; ack, skip")
                    self._ack(message, log)
                    return
            elif marker.get(retry=RETRY, timeout=self._clients.rpc_timeout_s).exists:
                self.count("skipped")
                log.info("marker exists: the job is done; ack, skip")
                self._ack(message, log)
                return
        except (gexc.GoogleAPICallError, gexc.RetryError):
            log.warning("the marker could not be read or written; nack", exc_info=True)
            self._release(marker, token, log)  # a create that landed unanswered
            self.count("nacked")
            message.nack()
            return
        try:
            self._work(message, key)
        except PoisonJob as exc:
            self._fail(message, marker, key, token, str(exc), log)
            return
        except Exception:  # any error: the redelivery runs the job again
            log.warning("the job failed; nack", exc_info=True)
            self._release(marker, token, log)
            self.count("nacked")
            message.nack()
            return
        if self.variant == "after":
            self._mark(marker, key, token, "done", log)
        self._ack(message, log)

    def _take(self, marker: Any, key: str, token: str) -> bool:
        """Create the marker; False if another delivery created it first."""
        try:
            marker.create(
                {"job": key, "token": token, "pid": os.getpid(), "state": "taken"},
                retry=RETRY,
                timeout=self._clients.rpc_timeout_s,
            )
            return True
        except gexc.AlreadyExists:
            # A retried create whose first attempt landed finds its own marker.
            snap = marker.get(retry=RETRY, timeout=self._clients.rpc_timeout_s)
            return bool(snap.exists and (snap.to_dict() or {}).get("token") == token)

    def _mark(self, marker: Any, key: str, token: str, state: str, log: _Log) -> None:
        """After the work: create the marker. The ack comes next whatever happens here."""
        try:
            marker.create(
                {"job": key, "token": token, "pid": os.getpid(), "state": state},
                retry=RETRY,
                timeout=self._clients.rpc_timeout_s,
            )
        except gexc.AlreadyExists:
            self.count("marker_raced")  # another delivery ran the work too, and marked first
            log.warning("marker created by another delivery meanwhile")
        except (gexc.GoogleAPICallError, gexc.RetryError):
            self.count("marker_failed")
            log.warning("the marker could not be written; ack anyway", exc_info=True)

    def _release(self, marker: Any, token: str, log: _Log) -> None:
        """Before a nack (``before``): delete this delivery's marker, if it wrote one, so
        that the redelivery runs the job (another delivery's marker is left alone)."""
        if self.variant != "before":
            return
        try:
            snap = marker.get(retry=RETRY, timeout=self._clients.rpc_timeout_s)
            if snap.exists and (snap.to_dict() or {}).get("token") == token:
                marker.delete(retry=RETRY, timeout=self._clients.rpc_timeout_s)
        except (gexc.GoogleAPICallError, gexc.RetryError):
            self.count("release_failed")
            log.warning("the marker could not be deleted", exc_info=True)

    def _fail(self, message: Any, marker: Any, key: str, token: str, why: str, log: _Log) -> None:
        """A poison job: to the failure topic, then marked (``after``) and acked."""
        try:
            self._clients.publisher.publish(
                self._clients.failure_topic,
                message.data,
                job=key,
                reason="permanent",
                error=why,
                message_id=message.message_id,
            ).result(timeout=PUBLISH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - not reported: the redelivery tries again
            log.warning("the failure message could not be published; nack")
            self._release(marker, token, log)
            self.count("nacked")
            message.nack()
            return
        self.count("failed")
        _effect("failed", key)
        log.error("poison job sent to the failure topic: %s", why)
        if self.variant == "after":
            self._mark(marker, key, token, "failed", log)
        self._ack(message, log)

    def _ack(self, message: Any, log: _Log) -> None:
        try:
            message.ack_with_response().result(timeout=ACK_TIMEOUT_S)
        except AcknowledgeError as exc:
            # Exactly-once: the ack id is stale (the message went to another delivery).
            self.count("acks_failed")
            log.warning("ack refused: %s", exc.error_code)
        except TimeoutError:
            self.count("acks_failed")
            log.warning("ack unanswered after %s s", ACK_TIMEOUT_S)

    # -- the work (the chaos handler's three steps) -------------------------------------

    def _work(self, message: Any, key: str) -> None:
        spec = json.loads(message.data)
        clients = self._clients
        if spec.get("poison"):
            raise PoisonJob("a poison job: it can never succeed")
        time.sleep(spec["prepare_ms"] / 1000)
        _effect("prepare", key)
        ref = clients.firestore.collection(clients.sink).document()  # its id: one per run
        ref.set(
            {"job": key, "pid": os.getpid(), "message_id": message.message_id},
            retry=RETRY,
            timeout=clients.rpc_timeout_s,
        )
        time.sleep(spec["emit_ms"] / 1000)
        clients.publisher.publish(
            clients.output_topic,
            f"output of {key}".encode(),
            job=key,
            effect_key=uuid.uuid4().hex,
        ).result(timeout=PUBLISH_TIMEOUT_S)
        _effect("done", key)


def _effect(kind: str, job: str) -> None:
    """Append one effect line (the chaos handler's format); one O_APPEND write."""
    line = {"effect": kind, "job": job, "pid": os.getpid(), "t": time.time()}
    fd = os.open(_env("CHAOS_EFFECTS"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _write_stats(baseline: Baseline) -> None:
    """Rewrite ``CHAOS_STATS`` with the counters (the fleet sums every process's file)."""
    path = _env("CHAOS_STATS")
    if not path:
        return
    with baseline._lock:
        counts = dict(baseline.counts)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as fh:
        json.dump({"pid": os.getpid(), "metrics": counts, "store": {}, "t": time.time()}, fh)
    os.replace(temporary, path)


def main() -> int:
    """Subscribe until SIGTERM or SIGINT, then stop the stream: 0; 1 if the stream failed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # Configured, the client libraries' "google" logger goes on propagating to the root
    # (left alone, google.api_core stops it and its records go out as plain text).
    logging.getLogger("google").setLevel(logging.INFO)
    # The client's own threads may die on shutdown (an ack retried on a closed channel):
    # logged as a record, not printed as a bare traceback.
    threading.excepthook = lambda args: _LOGGER.error(
        "thread %s ended by an exception",
        args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
    )
    project = _env("GOOGLE_CLOUD_PROJECT")
    lease_s = int(_env("PUBSUB_WORKER_LEASE_SECONDS", "10"))
    clients = _Clients(
        firestore=firestore.Client(project=project),
        publisher=pubsub_v1.PublisherClient(),
        markers=_env(MARKER_COLLECTION),
        sink=_env("CHAOS_SINK_COLLECTION"),
        output_topic=_env("CHAOS_OUTPUT_TOPIC"),
        failure_topic=_env("PUBSUB_WORKER_FAILURE_TOPIC"),
        rpc_timeout_s=float(_env("CHAOS_RPC_TIMEOUT_S", "3")),
    )
    baseline = Baseline(_env("CHAOS_BASELINE"), clients)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    subscriber = pubsub_v1.SubscriberClient()
    flow = pubsub_v1.types.FlowControl(
        max_messages=int(_env("PUBSUB_WORKER_MAX_MESSAGES", "8")),
        min_duration_per_lease_extension=lease_s,
        max_duration_per_lease_extension=lease_s,
        max_lease_duration=120,
    )
    future = subscriber.subscribe(
        _env("PUBSUB_WORKER_SUBSCRIPTION"), callback=baseline, flow_control=flow
    )
    _LOGGER.info("baseline %s subscribed", baseline.variant)
    while not stop.wait(STATS_INTERVAL_S) and not future.done():
        _write_stats(baseline)
    ended = future.done()  # the stream failed by itself: exit 1, the run restarts us
    future.cancel()
    try:
        future.result(timeout=10)
    except Exception:  # stopping: whatever ended the stream is logged
        _LOGGER.log(logging.ERROR if ended else logging.INFO, "stream ended", exc_info=True)
    subscriber.close()
    _write_stats(baseline)
    return 1 if ended and not stop.is_set() else 0


if __name__ == "__main__":
    raise SystemExit(main())
