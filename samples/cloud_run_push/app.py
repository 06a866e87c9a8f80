"""The push sample's ASGI app: ``uvicorn samples.cloud_run_push.app:app``.

The handler is the pull sample's (``samples/cloud_run/handler.py``: step
``charge``, then the receipt through the outbox), served unchanged behind a
push endpoint. ``pubsub-worker push samples.cloud_run.handler:handle`` serves
the same; this module is for a server of your choice (uvicorn, gunicorn with
uvicorn workers) or for mounting in an app you have (``main_app.mount("/pubsub",
app)`` in Starlette or FastAPI: Pub/Sub then pushes to ``https://HOST/pubsub/``).
Settings come from ``PUBSUB_WORKER_*`` when the server starts the app.
"""

from __future__ import annotations

from pubsub_worker.push import create_app
from samples.cloud_run.handler import handle

__all__ = ["app"]

app = create_app(handle)
