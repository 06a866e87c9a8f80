"""``pubsub-worker run``: load the handler and consume the subscription, or supervise N processes.

``--processes N`` runs N copies of the command without it, supervised by
:func:`pubsub_worker._worker.runner.supervise`; with ``--metrics-port PORT``,
process *i* serves on ``PORT + i``; without ``prometheus-client`` the
endpoint still answers ``/livez`` and ``/readyz`` (``/metrics`` answers 501,
:mod:`pubsub_worker._worker.serve`). On Cloud Run the shutdown grace
defaults to :data:`pubsub_worker.settings.CLOUD_RUN_GRACE_S`
(:meth:`~pubsub_worker.settings.Settings.from_env` applies it; this command
logs it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from typing import Any

from pubsub_worker._worker.runner import run, supervise
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings, cloud_run, platform_overrides

__all__ = ["cmd_run", "load_handler"]

_LOGGER = logging.getLogger("pubsub_worker")

_STOP_MARGIN_S = 15.0
"""What a supervised process gets past its grace period before it is killed."""


def load_handler(spec: str) -> Any:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"handler {spec!r}: expected 'package.module:function'")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(f"handler {spec!r}: {module_name} has no {attribute!r}") from exc


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """``run``: consume the subscription with the handler, in this process or N."""
    if platform_overrides(os.environ):
        _LOGGER.info(
            "on Cloud Run (%s is set): shutdown grace %.0f s, to fit its 10 s SIGTERM window "
            "(PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS overrides it)",
            cloud_run(os.environ),
            settings.shutdown_grace_seconds,
        )
    if args.processes > 1:
        return _run_processes(args, settings)
    handler = load_handler(args.handler)
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
