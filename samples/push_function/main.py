"""A Cloud Run function (functions-framework) that sends each welcome email once.

Deployed with a Pub/Sub trigger, the function gets each message as an
Eventarc CloudEvent (``google.cloud.pubsub.topic.v1.messagePublished``);
Eventarc's push subscription retries it until the function returns. Here the
event runs through the same job protocol as a ``pubsub-worker push``
endpoint (:class:`pubsub_worker.push.PushDeliveries`): the job document in
Firestore keeps the email from going out twice for one signup, however often
the event is delivered, and the function returns only once the completion
(or the failed record) is durable. Any other answer is raised
(:class:`NotNow`), which the framework answers 500: Pub/Sub delivers the
event again, after the subscription's retry backoff.

The platform checks the push token (the function does not allow
unauthenticated calls), so no token reaches this code.

Entry point: ``welcome`` (``--entry-point=welcome``). Settings: the
``PUBSUB_WORKER_*`` variables (``PUBSUB_WORKER_SUBSCRIPTION`` is the trigger's
subscription, see README.md).
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

import pubsub_worker
from pubsub_worker.push import Answer, PushDeliveries
from pubsub_worker.push.envelope import Malformed, from_cloud_event_data

__all__ = ["NotNow", "deliveries", "handle_event", "send_welcome", "welcome"]

_LOGGER = logging.getLogger(__name__)


def send_welcome(message: Any, job: pubsub_worker.Job) -> None:
    """The job: one welcome email per signup (the ``signup_id`` attribute is the key)."""
    try:
        signup = json.loads(message.data)
        email = str(signup["email"])
    except (ValueError, KeyError, TypeError) as exc:
        raise pubsub_worker.PermanentError(f"not a signup: {exc}") from exc

    def send() -> str:
        # A real mail API gets job.idempotency_key("send") and sends once for it.
        _LOGGER.info("sent the welcome email to %s", email)
        return job.idempotency_key("send")

    job.step("send", send)


deliveries = PushDeliveries(send_welcome)
"""The deliveries of this instance; started (settings read, clients built) on the first event."""


class NotNow(Exception):
    """The event was not taken now (busy elsewhere, a failed attempt, ...): deliver it again."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"{answer.status} {answer.outcome}: {answer.why}")
        self.answer = answer


def handle_event(cloud_event: Any) -> None:
    """Run one Pub/Sub CloudEvent's job; return once its outcome is durable, else raise.

    ``cloud_event`` is the framework's ``CloudEvent`` (``.data``, ``["id"]``).
    A malformed event raises :class:`NotNow` too (answered 500: retried until a
    dead-letter policy ends it, never taken as done).
    """
    try:
        message = from_cloud_event_data(cloud_event.data, event_id=cloud_event["id"])
    except Malformed as exc:
        raise NotNow(Answer(400, "malformed", exc.reason)) from exc
    answer = deliveries.deliver(message)
    if not answer.acked:
        raise NotNow(answer)


def _framework() -> Any:
    """functions-framework where it is installed (deployed); None without it (the tests)."""
    try:
        return importlib.import_module("functions_framework")
    except ImportError:
        return None


_FRAMEWORK = _framework()
welcome: Any = handle_event if _FRAMEWORK is None else _FRAMEWORK.cloud_event(handle_event)
"""The function's entry point: :func:`handle_event` as a functions-framework CloudEvent
function."""
