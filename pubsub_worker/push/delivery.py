"""One push request = one delivery through the job protocol, answered with an HTTP status.

A push delivery takes the pull worker's path
(:class:`~pubsub_worker._worker.flow.DeliveryFlow`: key, key gate, claim,
handler, conclusion), with the same handlers
(:meth:`~pubsub_worker.ExactlyOnce.call_handler`), fences
(:class:`~pubsub_worker._job.steps.JobCore`), outcome table
(:func:`~pubsub_worker._worker.outcome.decide`) and failure path. What
differs is the delivery itself:

* **No ack id, no Pub/Sub lease.** The Firestore lease is the only lease;
  the handler's progress renews it (every step, ``job.heartbeat()``) as in
  the pull worker. Each request is one attempt bounded by the push deadline
  (the subscription's ack deadline, which ``LEASE_SECONDS`` should equal):
  its processing cap is :func:`request_cap_s`, so that a request that would
  outlive the deadline stops at its next boundary with ``ProcessingTimeout``
  and is released (the attempt counted), not left half-done while Pub/Sub
  sends it again.
* **The answer is the ack.** :func:`answer_for` maps the decided outcome to
  a status once its write is durable: 200 for ``COMPLETE``, ``REVIEW`` and
  ``ACK`` (a duplicate of a finished job is answered from its record); 503
  for what must come back later (``DEFER``: another owner's live lease, the
  store unavailable; ``RELEASE``; ``NACK`` while draining), 500 for a failed
  attempt (``RETRY``), 409 for a request that lost the job (``DROP``, a lost
  ``NACK``). Pub/Sub retries every non-2xx answer, with its retry policy's
  backoff.
* **At least once, fenced.** A push subscription has no exactly-once
  delivery; the Firestore epoch is the whole protection, so the runtime's
  settings accept at-least-once delivery (:func:`push_settings`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore

from pubsub_worker._support import clients
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Counter, Metrics
from pubsub_worker._worker import runtime
from pubsub_worker._worker.flow import DeliveryFlow
from pubsub_worker._worker.outcome import Decision, Happened, Outcome, Phase, backoff_s
from pubsub_worker._worker.runtime import Runtime
from pubsub_worker._worker.wrapper import ExactlyOnce, Handler
from pubsub_worker.errors import LostOwnership
from pubsub_worker.hooks import Hooks
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import JobStore

from .message import PushMessage

__all__ = [
    "Answer",
    "PushDeliveries",
    "answer_for",
    "push_settings",
    "request_cap_s",
]

_LOGGER = logging.getLogger("pubsub_worker")

_MARGIN_MAX_S = 10
"""At most this much of the push deadline is kept for the release's write and the answer."""
_SETTLE_WAIT_S = 60.0
"""How long past its cap a request waits for a delivery concluded elsewhere (a held one)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a push request is answered: status, reason and, for a retry, when."""

    status: int
    outcome: str
    why: str
    retry_after_s: int | None = None

    @property
    def acked(self) -> bool:
        """A 2xx: Pub/Sub takes the message as acknowledged."""
        return 200 <= self.status < 300

    def body(self) -> bytes:
        """The JSON body: ``{"outcome", "why"}`` (the why clipped to 1 KiB)."""
        return json.dumps({"outcome": self.outcome, "why": self.why[:1024]}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Content type, and ``Retry-After`` for an answer that asks for a later retry."""
        found = [(b"content-type", b"application/json")]
        if self.retry_after_s is not None:
            found.append((b"retry-after", str(self.retry_after_s).encode()))
        return found


_STATUS: Mapping[Outcome, int] = {
    Outcome.COMPLETE: 200,
    Outcome.REVIEW: 200,
    Outcome.ACK: 200,
    Outcome.RETRY: 500,
    Outcome.RELEASE: 503,
    Outcome.DEFER: 503,
    Outcome.NACK: 503,
    Outcome.DROP: 409,
}
"""The status of each final outcome: 2xx exactly for the outcomes that ack."""


def answer_for(decision: Decision) -> Answer:
    """The HTTP answer of a decided outcome (carried out: its write is durable)."""
    outcome = decision.outcome
    status = _STATUS.get(outcome, 500)
    if outcome is Outcome.NACK and decision.error_type == LostOwnership.__name__:
        status = 409  # another delivery or owner holds the job: nothing to retry here
    retry = None
    if status == 503 and decision.delay_s > 0:
        retry = math.ceil(decision.delay_s)
    return Answer(status, outcome.value, decision.why, retry)


def request_cap_s(settings: Settings) -> int:
    """Seconds one push request may run: the deadline (``LEASE_SECONDS``) less a margin.

    The margin (a fifth of the lease, at most 10 s) is kept for the release's
    write and the answer; ``MAX_PROCESSING_SECONDS`` lowers it further.
    """
    lease = settings.lease_seconds
    margin = min(_MARGIN_MAX_S, max(lease // 5, 1))
    return max(min(settings.max_processing_seconds, lease - margin), 1)


def push_settings(settings: Settings) -> Settings:
    """The settings the push runtime runs with: at-least-once accepted, the request's cap.

    A push subscription cannot have exactly-once delivery: every request is
    fenced by the job document's epoch alone. The cap is
    :func:`request_cap_s` (below the lease, which the settings' own check
    would refuse for a pull worker, where the cap spans many leases).
    """
    return settings.model_copy(
        update={"allow_at_least_once": True, "max_processing_seconds": request_cap_s(settings)}
    )


class PushDeliveries:
    """Runs push requests through the job protocol: one :meth:`deliver` per request.

    ``handler`` is what :func:`pubsub_worker.exactly_once` takes: ``handler(message,
    job)`` or an existing ``callback(message)``, sync or ``async def``. Built
    lazily: nothing is read or connected until :meth:`start` (or the first
    :meth:`deliver`). Thread-safe; :meth:`deliver` blocks its thread for the
    whole delivery (run it off an event loop).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        settings: Settings | None = None,
        store: JobStore | None = None,
        firestore_client: firestore.Client | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self._handler = ExactlyOnce(handler)  # its handler call, not its runtime
        self._settings = settings
        self._store = store
        self._firestore_client = firestore_client
        self._publisher = publisher
        self._hooks = hooks or Hooks()
        self._lock = threading.Lock()  # guards _runtime
        self._runtime: Runtime | None = None
        self._stopping = threading.Event()
        self._draining = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Settings:
        """Read the settings, build the clients, check the failure topic; idempotent.

        Returns the settings in use. Raises
        :class:`~pubsub_worker.errors.ConfigError` or
        :class:`~pubsub_worker.errors.Unreachable` as the pull worker's start does
        (the subscription itself is not read: a push endpoint may not be allowed to).
        """
        with self._lock:
            if self._runtime is None:
                settings = self._settings = self._settings or Settings.from_env()
                publisher = self._publisher or clients.publisher_client(settings)
                rt = runtime.build(
                    push_settings(settings),
                    store=self._store,
                    firestore_client=self._firestore_client,
                    publisher=publisher,
                    hooks=self._hooks,
                    stopping=self._stopping,
                    draining=self._draining,
                )
                runtime.check_failure_topic(rt.settings, publisher)
                rt.checked = True
                self._runtime = rt
            self._runtime.keeper.start()
            return self._runtime.settings

    def configured(self) -> Settings:
        """The settings as configured (the environment read once); nothing is built."""
        with self._lock:
            if self._settings is None:
                self._settings = Settings.from_env()
            return self._settings

    @property
    def started(self) -> bool:
        """:meth:`start` succeeded."""
        return self._runtime is not None

    @property
    def draining(self) -> bool:
        """:meth:`drain` was called: new requests are answered 503 without a claim."""
        return self._draining.is_set()

    @property
    def metrics(self) -> Metrics:
        """The counters and gauges of these deliveries (after :meth:`start`)."""
        return self._ensure().metrics

    @property
    def settings(self) -> Settings:
        """The settings deliveries run with (:func:`push_settings` of the configured ones)."""
        return self._ensure().settings

    def in_flight(self) -> int:
        """Requests whose job is claimed and not concluded yet."""
        return 0 if self._runtime is None else self._runtime.keeper.in_flight()

    def watched(self) -> int:
        """Requests being delivered (waiting for their key or claim, or running)."""
        return 0 if self._runtime is None else self._runtime.keeper.watched()

    def drain(self) -> None:
        """Take no new job: a request not yet claimed is answered 503 (Pub/Sub retries)."""
        self._draining.set()

    def stop_jobs(self) -> None:
        """Stop in-flight jobs at their next boundary: released (503), never answered 2xx."""
        self._stopping.set()
        self._handler.stop_jobs()

    def close(self) -> None:
        """Stop the lease keeper and the handlers' event loop; in-flight requests should be over."""
        with self._lock:
            rt = self._runtime
        if rt is not None:
            rt.keeper.stop()
        self._handler.close()

    def _ensure(self) -> Runtime:
        if self._runtime is None:
            self.start()
        assert self._runtime is not None
        return self._runtime

    # -- one request --------------------------------------------------------------------

    def deliver(self, message: PushMessage, *, received_at: float | None = None) -> Answer:
        """Run one push delivery to its outcome; the answer once its write is durable.

        ``received_at``: ``time.monotonic()`` when the request arrived (the
        cap counts from it). Never raises: a failure is an answer.
        """
        received_at = time.monotonic() if received_at is None else received_at
        log = job_logger(_LOGGER, "?", message.message_id)
        try:
            rt = self._ensure()
        except Exception as exc:
            log.exception("the push endpoint cannot start; the message comes back later")
            decision = Decision(Outcome.DEFER, f"cannot start: {exc}", delay_s=backoff_s(1))
            return answer_for(decision)
        expected = rt.settings.subscription_path
        if message.subscription is not None and message.subscription != expected:
            why = (
                f"the request is for {message.subscription}, this endpoint serves {expected} "
                "(PUBSUB_WORKER_SUBSCRIPTION): its jobs would be recorded under the wrong "
                "subscription"
            )
            log.error("refused: %s", why)
            return Answer(400, "refused", why)
        rt.hooks.received(message.message_id)
        rt.metrics.inc(Counter.RECEIVED)
        seen = rt.tracker.seen(message.message_id)
        delivery = rt.tracker.register(message.message_id, message.ack_id)
        ticket = rt.keeper.watch(
            message,
            delivery,
            received_at=received_at,
            published_at=message.publish_time.timestamp(),
        )
        flow = DeliveryFlow(rt, message, delivery, ticket, log, self._handler.call_handler)
        try:
            flow.run(seen)
        except Exception as exc:
            log.exception("unexpected error")
            if not flow.detached:
                flow.conclude(Happened(Phase.RUN, error=exc))
        finally:
            flow.end()
        return self._settled(flow, rt, log)

    def _settled(self, flow: DeliveryFlow, rt: Runtime, log: Any) -> Answer:
        """The answer once the delivery is settled (a held one: once its ack() or nack())."""
        wait_s = rt.settings.max_processing_seconds + _SETTLE_WAIT_S
        try:
            settled = flow.settled.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            log.error("not concluded %.0f s after its cap; answered 503", wait_s)
            return Answer(503, Outcome.DEFER.value, "the delivery was not concluded in time")
        return answer_for(settled.decision)
