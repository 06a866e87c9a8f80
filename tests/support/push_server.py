"""A push endpoint served by a real uvicorn server on loopback, for tests that speak HTTP.

What a sender sees over the wire (status lines, header names lower-cased by
the HTTP stack, a body read in chunks, the ASGI lifespan) is only seen
through a real server. :class:`PushServer` serves any ASGI app (usually a
:class:`~pubsub_worker.push.PushApp`) with ``uvicorn.Server`` in a daemon
thread, on a loopback port the operating system picks, and waits until it
answers::

    app = create_app(
        handler,
        settings=pubsub_worker.Settings(subscription=SUB, key_attribute="op"),
        store=MemoryJobStore(),
        publisher=FakePublisher(),  # no Pub/Sub client is built
        verifier=None,  # or a TokenVerifier on test keys (tests/unit/push/tokens.py)
    )
    with PushServer(app) as server:
        answer = httpx.post(server.url, json=envelope)

The lifespan is on, as under ``pubsub-worker push``: the server starts the
app (a start-up error fails :meth:`PushServer.start` with uvicorn's reason)
and, when the block ends, asks it to drain and shut down, then waits for the
thread. Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal

import uvicorn

__all__ = ["PushServer"]

_HOST = "127.0.0.1"


class _Startup(logging.Handler):
    """Keeps what uvicorn logs at ERROR while it starts, to say why a start failed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class PushServer:
    """``app`` served by uvicorn on a free loopback port in a thread; a context manager.

    ``lifespan``: ``"on"`` (the default: the server starts and shuts down the
    app, as ``pubsub-worker push`` does) or ``"off"`` (the app starts on its
    first request, as when it is mounted in another app).
    """

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "on") -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((_HOST, 0))  # bound here: the port is known before the server runs
        self.port: int = self._socket.getsockname()[1]
        """The loopback port served."""
        self._config = uvicorn.Config(
            app,
            lifespan=lifespan,
            log_config=None,  # the test's own logging (pytest's capture)
            access_log=False,
            timeout_graceful_shutdown=10,
        )
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"test-push-server-{self.port}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/``: where Pub/Sub would POST."""
        return f"http://{_HOST}:{self.port}/"

    def start(self, timeout_s: float = 15.0) -> PushServer:
        """Run the server and wait until it accepts requests; ``RuntimeError`` if it does not."""
        errors = _Startup()
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addHandler(errors)
        try:
            self._thread.start()
            deadline = time.monotonic() + timeout_s
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    why = "; ".join(errors.lines) or f"not serving after {timeout_s} s"
                    raise RuntimeError(f"the push server did not start: {why}")
                time.sleep(0.01)
        finally:
            uvicorn_log.removeHandler(errors)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the server to exit (the app drains and shuts down) and wait for its thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the push server on port {self.port} did not stop")

    def __enter__(self) -> PushServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
