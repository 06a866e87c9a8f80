"""``pubsub-worker push``: serve a push subscription's requests with the handler (uvicorn).

``pubsub-worker push package.module:handle --port 8080`` serves ``POST /``
(push requests), ``/livez`` and ``/readyz`` (:mod:`pubsub_worker.push.app`)
on ``--host``:``--port`` (default ``0.0.0.0`` and ``$PORT`` or 8080, as
Cloud Run sets it), and with ``--metrics-port N`` ``/metrics``, ``/livez``
and ``/readyz`` on a port of their own, as ``pubsub-worker run`` does. It
reads the same ``PUBSUB_WORKER_*`` variables; the endpoint starts (clients,
failure topic, the token check's settings) before it listens, so a bad
setting exits 2 with one line; so do a handler path that does not load and a
``--port`` or ``--metrics-port`` that another process holds
(:func:`~pubsub_worker.cli.run.load_handler`,
:func:`~pubsub_worker.cli.run.check_port`).

On SIGTERM or SIGINT it stops taking jobs at once (a new request is answered
503 and comes back), lets the jobs in flight run for
``SHUTDOWN_GRACE_SECONDS`` (5 s on Cloud Run), stops the rest at their next
boundary (released, answered 503), then exits 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import socket
import threading
from types import FrameType
from typing import Any

from pubsub_worker._support import idle
from pubsub_worker._support.distribution import install_line
from pubsub_worker._worker.serve import DEFAULT_HOST, Health, MetricsServer
from pubsub_worker.errors import ConfigError
from pubsub_worker.push import PushApp, create_app
from pubsub_worker.settings import cloud_run, platform_overrides

from .environment import worker_settings
from .output import Output
from .run import add_metrics_options, check_port, load_handler, port_number

__all__ = ["DEFAULT_PORT", "cmd_push", "default_port", "register"]

_LOGGER = logging.getLogger("pubsub_worker")

DEFAULT_PORT = 8080
"""The port served when neither ``--port`` nor ``$PORT`` says otherwise."""

_SPARE_CONNECTIONS = 16
"""Requests uvicorn admits beyond ``MAX_MESSAGES``: probes, and the busy answers themselves."""

_CLOSE_MARGIN_S = 5.0
"""What requests get past the grace to be released and answered before connections close."""


def register(commands: Any) -> None:
    """Add ``push`` to the command's subparsers."""
    parser = commands.add_parser("push", help="serve a push subscription's requests with a handler")
    parser.add_argument("handler", help="package.module:function, taking (message, job)")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=default_port(),
        metavar="N",
        help="port to serve on (default $PORT, else 8080)",
    )
    add_metrics_options(parser)
    parser.set_defaults(func=cmd_push)


def default_port() -> int:
    """``$PORT`` (Cloud Run sets it) or :data:`DEFAULT_PORT`."""
    try:
        return int(os.environ.get("PORT", DEFAULT_PORT))
    except ValueError:
        return DEFAULT_PORT


def cmd_push(args: argparse.Namespace, out: Output) -> int:
    """``push``: serve push requests until SIGTERM; 0 once every request was answered."""
    settings = worker_settings(args)
    try:
        import uvicorn  # noqa: PLC0415 - the push extra
    except ImportError as exc:
        raise ConfigError(f"push needs uvicorn: {install_line('push')} ({exc})") from exc
    if platform_overrides(os.environ):
        _LOGGER.info(
            "on Cloud Run (%s is set): shutdown grace %.0f s, to fit its 10 s SIGTERM window",
            cloud_run(os.environ),
            settings.shutdown_grace_seconds,
        )
    handler = load_handler(args.handler)
    check_port(args.host, args.port, "--port")
    if args.metrics_port is not None:
        check_port(args.metrics_host, args.metrics_port, "--metrics-port")
    app = create_app(handler, settings=settings)
    app.start()  # ConfigError (exit 2), Unreachable (exit 3): one line
    health = Health()
    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsServer(
            health, app.deliveries.metrics, port=args.metrics_port, host=args.metrics_host
        )
        metrics.start()
    serving: concurrent.futures.Future[None] = concurrent.futures.Future()  # pending: serving
    health.running(serving)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        log_config=None,  # the command's own logging (text or JSON lines)
        access_log=False,  # every delivery logs its outcome with its key and message id
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds + _CLOSE_MARGIN_S) + 1,
        # Past MAX_MESSAGES requests the endpoint answers 503 at once; past this many open
        # requests uvicorn itself does, before reading them (probes keep some room).
        limit_concurrency=settings.max_messages + _SPARE_CONNECTIONS,
    )
    server = _server(config, app, health, settings.subscription_path)
    # uvicorn re-raises the signal it stopped on through the handler it found: a no-op here,
    # so that a SIGTERM ends the command with 0, as `run` does.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    reporter = idle.report_idle(
        settings, app.deliveries.metrics, app.deliveries.engine.in_flight, pull=False
    )  # "idle: ..." lines while no request arrives
    try:
        server.run()
    finally:
        reporter.stop()
        serving.set_result(None)
        if metrics is not None:
            metrics.stop()
    stuck = [t for t in threading.enumerate() if t.name.startswith("pubsub-worker-push")]
    if any(t.is_alive() for t in stuck):  # a handler blocked in user code: its job was released
        _LOGGER.warning("%d request thread(s) still blocked; exiting anyway", len(stuck))
        logging.shutdown()
        os._exit(0 if server.started else 1)
    return 0 if server.started else 1


def _server(config: Any, app: PushApp, health: Health, subscription: str) -> Any:
    """uvicorn's server, which starts the endpoint's shutdown the moment a signal arrives."""
    import uvicorn  # noqa: PLC0415 - the push extra

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                _LOGGER.info("signal %d: no new jobs; in-flight ones get the grace", sig)
                health.stopping()
                app.begin_shutdown()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                port = next(
                    (s.getsockname()[1] for server in self.servers for s in server.sockets),
                    self.config.port,
                )
                _LOGGER.info(
                    "serving push requests of %s on http://%s:%d (POST /, /livez, /readyz)",
                    subscription,
                    self.config.host,
                    port,
                )

    return Server(config)
