"""Push subscriptions: the same exactly-once processing behind an HTTP endpoint.

::

    from pubsub_worker.push import create_app

    def handle(message, job):                      # the handler the pull worker runs
        job.step("charge", lambda: charge(message.data))

    app = create_app(handle)                       # an ASGI app: uvicorn module:app

or ``pubsub-worker push module:handle --port 8080``. A push request is one
delivery through the job protocol: the same handlers (``handler(message,
job)`` or ``callback(message)``, sync or ``async def``), hooks, fences,
failure path and replay; the answer is 2xx only once the completion (or the
failed record) is durable. See ``docs/push.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .app import PushApp
from .auth import TokenVerifier
from .delivery import Answer, PushDeliveries
from .envelope import Malformed
from .message import PushMessage, Shape

if TYPE_CHECKING:
    import google.cloud.pubsub_v1 as pubsub_v1
    from google.cloud import firestore

    from pubsub_worker.hooks import Hooks
    from pubsub_worker.settings import Settings
    from pubsub_worker.stores.base import JobStore

__all__ = [
    "Answer",
    "Malformed",
    "PushApp",
    "PushDeliveries",
    "PushMessage",
    "Shape",
    "TokenVerifier",
    "create_app",
]

_UNSET: Any = object()


def create_app(
    handler: Any,
    *,
    settings: Settings | None = None,
    store: JobStore | None = None,
    firestore_client: firestore.Client | None = None,
    publisher: pubsub_v1.PublisherClient | None = None,
    hooks: Hooks | None = None,
    verifier: TokenVerifier | None = _UNSET,
) -> PushApp:
    """The ASGI app serving push requests with ``handler``; nothing is read until it starts.

    ``handler`` is what :func:`pubsub_worker.exactly_once` takes. ``settings``
    default to the ``PUBSUB_WORKER_*`` variables (read at start-up);
    ``verifier`` to the token check they ask for (``None``: no check).
    """
    deliveries = PushDeliveries(
        handler,
        settings=settings,
        store=store,
        firestore_client=firestore_client,
        publisher=publisher,
        hooks=hooks,
    )
    if verifier is _UNSET:
        return PushApp(deliveries)  # the check the settings ask for
    return PushApp(deliveries, verifier=verifier)
