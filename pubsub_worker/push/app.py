"""The push endpoint: a raw ASGI application, no web framework needed.

===========  ========================================================================
route        answer
===========  ========================================================================
``POST /``   a push request: 503 at once (``Retry-After``) when ``MAX_MESSAGES``
             requests are being delivered already; token checked (401/403, before
             the body is read), body read whole (413 past
             :data:`~pubsub_worker.push.envelope.MAX_BODY_BYTES`; a body cut short of
             its ``Content-Length`` or by a disconnect is no delivery: nothing runs),
             parsed (400 with the reason when it is no push request), then delivered
             through the delivery engine (:mod:`pubsub_worker.push.delivery`): 200
             only once the completion or the failed record is durable
``/livez``   200 while the endpoint serves; 503 once it was closed
``/readyz``  200 once started (the clients built, the failure topic checked) and not
             draining; 503 with the reason otherwise (a probe starts it if needed)
===========  ========================================================================

Served on its own (``pubsub-worker push``, uvicorn, gunicorn with uvicorn
workers) it starts and stops with the ASGI lifespan; mounted in a Starlette
or FastAPI app (``app.mount("/pubsub", push_app)``: routes are relative to
the mount) it starts on the first request or probe, and the host app's
lifespan should call :meth:`PushApp.shutdown` so in-flight jobs end cleanly.
Deliveries run on a pool of ``MAX_MESSAGES`` threads: at most that many at
once, and no queue: a request that finds them all busy is answered 503 at
once (Pub/Sub sends it again with its retry policy's backoff) instead of
waiting, its cap running, for a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pubsub_worker._support.logs import job_logger

from .auth import CertificatesUnavailable, Refused, TokenVerifier, verifier_for
from .delivery import Answer, PushDeliveries
from .envelope import MAX_BODY_BYTES, Malformed, parse

_BUSY_RETRY_AFTER_S = 1
"""What a request that finds every delivery thread busy is told (Retry-After, seconds)."""

__all__ = ["PushApp"]

_LOGGER = logging.getLogger("pubsub_worker")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_UNSET: Any = object()


class _TooLarge(Exception):
    pass


class _Incomplete(Exception):
    """The body ended before the request did (a disconnect, or short of Content-Length)."""


class PushApp:
    """An ASGI app serving push requests with ``deliveries`` (see the module docstring).

    ``verifier``: the token check; by default the one the settings ask for
    (:func:`~pubsub_worker.push.auth.verifier_for`), made at :meth:`start`;
    ``None`` turns it off (as ``PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false`` does).
    """

    def __init__(self, deliveries: PushDeliveries, *, verifier: TokenVerifier | None = _UNSET):
        self.deliveries = deliveries
        self._verifier: TokenVerifier | None = verifier
        self._verifier_set = verifier is not _UNSET
        self._start_lock = threading.Lock()  # one start at a time
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._start_error: str | None = None
        self._slots = threading.Semaphore(0)  # one per delivery thread, made at start
        self._key_attribute: str | None = None  # matched case-insensitively in header names

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Build the runtime and the token check; idempotent. Raises ``ConfigError`` and such."""
        with self._start_lock:
            if self._pool is not None:
                return
            if not self._verifier_set:  # its settings first: no I/O before a ConfigError
                self._verifier = verifier_for(self.deliveries.configured())
                self._verifier_set = True
            settings = self.deliveries.start()
            self._key_attribute = settings.key_attribute
            self._slots = threading.Semaphore(settings.max_messages)
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=settings.max_messages, thread_name_prefix="pubsub-worker-push"
            )
            self._start_error = None

    def begin_shutdown(self, grace_s: float | None = None) -> threading.Thread:
        """Drain now (new requests 503); after ``grace_s`` stop in-flight jobs (released).

        Returns the thread that waits out the grace (``SHUTDOWN_GRACE_SECONDS``
        by default): call it on SIGTERM, before the server stops reading
        requests. Once per shutdown: a later call (the lifespan's) returns the
        same thread, so the grace is given once.
        """
        return self.deliveries.engine.begin_shutdown(grace_s)

    def shutdown(self, grace_s: float | None = None, timeout_s: float = 30.0) -> None:
        """Drain, give in-flight jobs the grace (once), stop the rest, wait for them, close."""
        self.begin_shutdown(grace_s)
        self._closed = True
        pool, self._pool = self._pool, None
        self.deliveries.engine.finish_shutdown(timeout_s)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop serving jobs: the pool, the lease keeper and the handlers' loop."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self.deliveries.engine.close()

    @property
    def started(self) -> bool:
        """:meth:`start` succeeded."""
        return self._pool is not None

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point (HTTP and lifespan)."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        received_at = time.monotonic()
        path = _route(scope)
        method = scope.get("method", "GET")
        if path in ("/livez", "/healthz", "/readyz"):
            if method not in ("GET", "HEAD"):
                await _send(send, 405, "text/plain", b"GET only\n", [(b"allow", b"GET, HEAD")])
                return
            status, text = await self._probe(path)
            await _send(send, status, "text/plain; charset=utf-8", (text + "\n").encode())
            return
        if path != "/":
            await _send(send, 404, "text/plain", b"not found: POST /, /livez, /readyz\n")
            return
        if method != "POST":
            await _send(send, 405, "text/plain", b"POST only\n", [(b"allow", b"POST")])
            return
        answer = await self._push(scope, receive, received_at)
        await _send(send, answer.status, "application/json", answer.body(), answer.headers()[1:])

    async def _push(self, scope: Scope, receive: Receive, received_at: float) -> Answer:
        if not await self._ensure_started():
            return Answer(503, "unavailable", f"the endpoint cannot start: {self._start_error}")
        pool = self._pool
        if self._closed or pool is None:
            return Answer(503, "unavailable", "the endpoint is shutting down")
        headers = _headers(scope)
        verifier = self._verifier
        if verifier is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, verifier.verify, headers.get("authorization")
                )
            except Refused as exc:
                _LOGGER.warning("push request refused (%d): %s", exc.status, exc.reason)
                return Answer(exc.status, "refused", exc.reason)
            except CertificatesUnavailable as exc:
                _LOGGER.error("cannot verify push tokens now: %s", exc)
                return Answer(503, "unavailable", str(exc))
        if not self._slots.acquire(blocking=False):
            why = "every delivery thread is busy (MAX_MESSAGES): sent again later, nothing run"
            return Answer(503, "busy", why, _BUSY_RETRY_AFTER_S)
        try:
            return await self._deliver(pool, scope, headers, receive, received_at)
        finally:
            self._slots.release()

    async def _deliver(
        self,
        pool: concurrent.futures.Executor,
        scope: Scope,
        headers: dict[str, str],
        receive: Receive,
        received_at: float,
    ) -> Answer:
        try:
            body = await _body(receive, _content_length(headers))
        except _TooLarge:
            why = f"the body is over {MAX_BODY_BYTES} bytes: no Pub/Sub message is that large"
            return Answer(413, "refused", why)
        except _Incomplete as exc:
            _LOGGER.warning("push request cut short (no delivery): %s", exc)
            return Answer(400, "incomplete", str(exc))
        try:
            message = parse(headers, body, key_attribute=self._key_attribute)
        except Malformed as exc:
            _LOGGER.warning("malformed push request (400): %s", exc.reason)
            return Answer(400, "malformed", exc.reason)
        if self._closed:
            return Answer(503, "unavailable", "the endpoint is shutting down")
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, lambda: self.deliveries.deliver(message, received_at=received_at)
            )
        except RuntimeError:  # the pool was shut down meanwhile
            job_logger(_LOGGER, "?", message.message_id).info("arrived while shutting down")
            return Answer(503, "unavailable", "the endpoint is shutting down")

    async def _ensure_started(self) -> bool:
        if self._pool is not None:
            return True
        if self._closed:
            self._start_error = "closed"
            return False
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.start)
        except Exception as exc:  # noqa: BLE001 - answered 503 and logged; the next request retries
            self._start_error = f"{type(exc).__name__}: {exc}"
            _LOGGER.error("the push endpoint cannot start: %s", self._start_error)
            return False
        return True

    async def _probe(self, path: str) -> tuple[int, str]:
        if path in ("/livez", "/healthz"):
            return (503, "closed") if self._closed else (200, "ok")
        if not await self._ensure_started():
            return 503, f"cannot start: {self._start_error}"
        ready, why = self.deliveries.engine.ready()
        return (200, "ok") if ready else (503, why)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self.start)
                except Exception as exc:  # noqa: BLE001 - the server reports it and exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                await asyncio.get_running_loop().run_in_executor(None, self.shutdown)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _route(scope: Scope) -> str:
    """The path below the mount point (Starlette keeps the full path and sets root_path)."""
    path = str(scope.get("path") or "/")
    root = str(scope.get("root_path") or "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def _headers(scope: Scope) -> dict[str, str]:
    """Header names in lowercase (as ASGI gives them); a repeated header keeps its last value."""
    return {
        bytes(name).decode("latin-1").lower(): bytes(value).decode("latin-1")
        for name, value in scope.get("headers", [])
    }


def _content_length(headers: dict[str, str]) -> int | None:
    """The declared body size, if any (a malformed one is left to the server: None)."""
    text = headers.get("content-length", "").strip()
    return int(text) if text.isdigit() else None


async def _body(receive: Receive, expected: int | None) -> bytes:
    """The whole body, or :class:`_Incomplete`: a push request is taken whole or not at all."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            raise _Incomplete(f"the client disconnected after {size} bytes of the body")
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if not event.get("more_body", False):
            break
    if expected is not None and size != expected:
        raise _Incomplete(f"the body has {size} bytes, Content-Length says {expected}")
    return b"".join(chunks)


async def _send(
    send: Send,
    status: int,
    content_type: str,
    body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
