"""One push request = one delivery through the job protocol, answered with an HTTP status.

The push door of the delivery engine (:mod:`pubsub_worker._worker.engine`):
a push delivery enters the same engine as a pulled message, with the same
handlers (wrapped with ``@exactly_once`` or not), intake, key gate, claim,
fences (:class:`~pubsub_worker._job.core.JobCore`), outcome table
(:func:`~pubsub_worker._worker.outcome.decide`), failure path and lifecycle.
What differs is the delivery itself:

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
  store unavailable, too little of the request's cap left to claim the job;
  ``RELEASE``; ``NACK`` while draining), 500 for a failed attempt
  (``RETRY``), 409 for a request that lost the job or whose message a newer
  request of this instance settles (``DROP``, a lost ``NACK``), 400 for a
  request of another subscription. Pub/Sub retries every non-2xx answer, with
  its retry policy's backoff.
* **A duplicate adopts.** A second request for a message whose first request
  still runs on this instance waits for it, then is answered from the job's
  record (200 once it completed); it runs nothing.
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
from collections.abc import Mapping
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore

from pubsub_worker._support.metrics import Metrics
from pubsub_worker._worker.engine import Decision, DeliveryFlow, Door, Engine, Outcome, Phase
from pubsub_worker.errors import ConfigError, LostOwnership
from pubsub_worker.hooks import Hooks
from pubsub_worker.settings import Settings
from pubsub_worker.stores.base import JobStore

from .message import PushMessage

__all__ = [
    "PUSH",
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
    if decision.phase is Phase.RECEIPT and decision.error_type == ConfigError.__name__:
        return Answer(400, "refused", decision.why)  # another subscription's request
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


PUSH = Door("push", settings_for=push_settings, reads_subscription=False, keeps_order=False)
"""The push endpoint's door: the request's cap, no subscription read, no ordering memory
(Pub/Sub pushes the next message of an ordering key only after a 2xx)."""


class PushDeliveries:
    """Runs push requests through the delivery engine: one :meth:`deliver` per request.

    ``handler`` is what :func:`pubsub_worker.exactly_once` takes (``handler(message,
    job)`` or an existing ``callback(message)``, sync or ``async def``), or a
    handler wrapped already with ``@exactly_once`` (its options are used where
    none are given here); anything else raises
    :class:`~pubsub_worker.errors.InvalidHandler` now. Nothing is read or
    connected until :meth:`start` (or the first :meth:`deliver`). Thread-safe;
    :meth:`deliver` blocks its thread for the whole delivery (run it off an
    event loop).
    """

    def __init__(
        self,
        handler: Any,
        *,
        settings: Settings | None = None,
        store: JobStore | None = None,
        firestore_client: firestore.Client | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.engine = Engine(
            handler,
            door=PUSH,
            settings=settings,
            store=store,
            firestore_client=firestore_client,
            publisher=publisher,
            hooks=hooks,
        )

    def start(self) -> Settings:
        """Read the settings, build the clients, check the failure topic; idempotent.

        Returns the settings in use. Raises
        :class:`~pubsub_worker.errors.ConfigError` or
        :class:`~pubsub_worker.errors.Unreachable` as the pull worker's start does
        (the subscription itself is not read: a push endpoint may not be allowed to).
        """
        return self.engine.start().settings

    def configured(self) -> Settings:
        """The settings as configured (the environment read once); nothing is built."""
        return self.engine.configured()

    def close(self) -> None:
        """Stop the lease keeper and the handlers' event loop; requests should be over."""
        self.engine.close()

    @property
    def metrics(self) -> Metrics:
        """The counters and gauges of these deliveries (after :meth:`start`)."""
        return self.engine.metrics

    @property
    def settings(self) -> Settings:
        """The settings deliveries run with (:func:`push_settings` of the configured ones)."""
        return self.engine.settings

    def deliver(self, message: PushMessage, *, received_at: float | None = None) -> Answer:
        """Run one push delivery to its outcome; the answer once its write is durable.

        ``received_at``: ``time.monotonic()`` when the request arrived (the
        cap counts from it). Never raises: a failure is an answer.
        """
        flow = self.engine.deliver(
            message, received_at=received_at, subscription=message.subscription
        )
        if flow is None:
            return Answer(503, Outcome.DEFER.value, "the endpoint cannot start", 10)
        return self._settled(flow)

    def _settled(self, flow: DeliveryFlow) -> Answer:
        """The answer once the delivery is settled (a held one: once its ack() or nack())."""
        wait_s = self.engine.settings.max_processing_seconds + _SETTLE_WAIT_S
        try:
            settled = flow.settled.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            _LOGGER.error("not concluded %.0f s after its cap; answered 503", wait_s)
            return Answer(503, Outcome.DEFER.value, "the delivery was not concluded in time")
        return answer_for(settled.decision)
