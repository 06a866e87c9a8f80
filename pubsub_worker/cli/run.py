"""``pubsub-worker run``: load the handler and consume the subscription, or supervise N processes.

``--processes N`` runs N copies of the command without it, supervised by
:func:`pubsub_worker._worker.runner.supervise`; with ``--metrics-port PORT``,
process *i* serves on ``PORT + i``; without ``prometheus-client`` the
endpoint still answers ``/livez`` and ``/readyz`` (``/metrics`` answers 501,
:mod:`pubsub_worker._worker.serve`). On Cloud Run the shutdown grace
defaults to :data:`pubsub_worker.settings.CLOUD_RUN_GRACE_S`
(:meth:`~pubsub_worker.settings.Settings.from_env` applies it; this command
logs it).

Start-up errors are one line each (exit 2, :mod:`pubsub_worker.cli.exit_codes`):
a handler path that does not load (:func:`load_handler` names the path and
what is wrong with it) and a port that another process holds
(:func:`check_port`, before anything starts). With ``--processes N`` the
supervisor loads the handler as well, for that one line: its module is
imported there once more.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import socket
import sys
import threading
from typing import Any

from pubsub_worker._worker.runner import run, supervise
from pubsub_worker._worker.serve import DEFAULT_HOST
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings, cloud_run, platform_overrides

from .environment import worker_settings
from .output import Output

__all__ = [
    "add_metrics_options",
    "check_port",
    "cmd_run",
    "load_handler",
    "port_number",
    "register",
]

_LOGGER = logging.getLogger("pubsub_worker")

_STOP_MARGIN_S = 15.0
"""What a supervised process gets past its grace period before it is killed."""


def register(commands: Any) -> None:
    """Add ``run`` to the command's subparsers."""
    parser = commands.add_parser("run", help="consume the subscription with a handler")
    parser.add_argument("handler", help="package.module:function, taking (message, job)")
    add_metrics_options(parser)
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        choices=range(1, 65),
        help="run N worker processes (1 to 64) on the subscription, supervised",
    )
    parser.set_defaults(func=cmd_run)


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host``: the metrics and health endpoint's address."""
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="N",
        help="serve /metrics (Prometheus), /livez and /readyz on this port (0: any free port)",
    )
    parser.add_argument(
        "--metrics-host", default=DEFAULT_HOST, help=f"address to serve on (default {DEFAULT_HOST})"
    )


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free one); ``ArgumentTypeError`` otherwise."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port, 0 to 65535")
    return number


def check_port(host: str, number: int, flag: str) -> None:
    """Raise :class:`ConfigError` naming ``flag`` when ``host:number`` cannot be listened on.

    Bound and closed at once, with ``SO_REUSEADDR`` as the servers bind, so
    only a port that another process listens on (or an address this host
    does not have) is refused.
    """
    if number == 0:
        return
    if number > 65535:
        raise ConfigError(f"{flag}: {number} is past the last port, 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, number))
        except OSError as exc:
            why = (
                "address already in use (another process listens there; pick another port, "
                "or 0 for any free one)"
                if exc.errno == errno.EADDRINUSE
                else exc.strerror or str(exc)
            )
            raise ConfigError(f"{flag} {number}: cannot listen on {host}:{number}: {why}") from exc


def load_handler(spec: str) -> Any:
    """The callable ``spec`` names (``package.module:function``), imported from the cwd too.

    Raises :class:`ConfigError` naming ``spec`` and what is wrong: not of that
    form, a module that cannot be imported or fails while importing, no such
    attribute, or an attribute that is not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"handler {spec!r}: expected 'package.module:function'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"handler {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        handler = getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(f"handler {spec!r}: {module_name} has no {attribute!r}") from exc
    if not callable(handler):
        raise ConfigError(
            f"handler {spec!r}: {module_name}.{attribute} is a {type(handler).__name__}, "
            "not a function taking (message, job)"
        )
    return handler


def cmd_run(args: argparse.Namespace, out: Output) -> int:
    """``run``: consume the subscription with the handler, in this process or N."""
    settings = worker_settings(args)
    if platform_overrides(os.environ):
        _LOGGER.info(
            "on Cloud Run (%s is set): shutdown grace %.0f s, to fit its 10 s SIGTERM window "
            "(PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS overrides it)",
            cloud_run(os.environ),
            settings.shutdown_grace_seconds,
        )
    # In the supervisor too, so that a bad path is one line, not one per process.
    handler = load_handler(args.handler)
    if args.metrics_port is not None:
        count = args.processes if args.metrics_port else 1
        for index in range(count):
            check_port(args.metrics_host, args.metrics_port + index, "--metrics-port")
    if args.processes > 1:
        return _run_processes(args, settings)
    code = run(
        handler, settings=settings, metrics_port=args.metrics_port, metrics_host=args.metrics_host
    )
    stuck = [
        t for t in threading.enumerate() if t.name.startswith("pubsub-worker") and t.is_alive()
    ]
    stuck = [t for t in stuck if t.name != "pubsub-worker-metrics"]
    if stuck:  # a job blocked in user code: its job was released; do not hang the exit
        _LOGGER.warning("%d callback thread(s) still blocked; exiting anyway", len(stuck))
        logging.shutdown()
        os._exit(code)
    return code


def _run_processes(args: argparse.Namespace, settings: Settings) -> int:
    """``--processes N``: N copies of this command without it, supervised."""
    commands = []
    for index in range(args.processes):
        command = [sys.executable, "-m", "pubsub_worker.cli", "run", args.handler]
        if args.metrics_port is not None:
            # One endpoint per process: process i serves on PORT + i.
            port = args.metrics_port + index if args.metrics_port else 0
            command += ["--metrics-port", str(port), "--metrics-host", args.metrics_host]
        commands.append(command)
    return supervise(commands, stop_timeout_s=settings.shutdown_grace_seconds + _STOP_MARGIN_S)
