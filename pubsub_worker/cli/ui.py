"""``pubsub-worker ui``: the jobs dashboard, served by uvicorn (``pubsub-worker[ui]``).

``pubsub-worker ui [--host 127.0.0.1] [--port $PORT or 8000] [--allow-actions]
[--subscription NAME ...]`` reads the same ``PUBSUB_WORKER_*`` settings as
every command: the jobs of ``PUBSUB_WORKER_SUBSCRIPTION`` (plus those named by
``--subscription``, in the same collection). It is read-only unless started
with ``--allow-actions``, and bound to loopback unless another ``--host`` is
given (then it says so: put it behind Identity-Aware Proxy, and give
``--iap-audience`` so that it refuses whatever IAP did not sign, docs/ui.md).
Firestore is read once before it listens, so a bad setting or an unreachable
Firestore exits 3 with one line.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from pubsub_worker._support import clients
from pubsub_worker._support.distribution import install_line
from pubsub_worker._support.logs import configure
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings

from .output import Output

__all__ = ["DEFAULT_UI_PORT", "add_ui_parser", "cmd_ui", "register"]

_LOGGER = logging.getLogger("pubsub_worker.ui")

DEFAULT_UI_PORT = 8000
"""The port served when neither ``--port`` nor ``$PORT`` (Cloud Run sets it) says otherwise."""
_LOOPBACK = "127.0.0.1"


def _default_port() -> int:
    try:
        return int(os.environ.get("PORT", DEFAULT_UI_PORT))
    except ValueError:
        return DEFAULT_UI_PORT


def register(commands: Any) -> None:
    """Add ``ui`` to the command's subparsers."""
    add_ui_parser(commands)


def add_ui_parser(sub: Any) -> None:
    """The ``ui`` subcommand and its options."""
    ui_p = sub.add_parser("ui", help="the jobs dashboard (read-only unless --allow-actions)")
    ui_p.set_defaults(func=cmd_ui)
    ui_p.add_argument(
        "--host",
        default=_LOOPBACK,
        help=f"address to serve on (default {_LOOPBACK}; another one only behind a proxy "
        "that authenticates, such as Identity-Aware Proxy)",
    )
    ui_p.add_argument(
        "--port",
        type=int,
        default=_default_port(),
        metavar="N",
        help=f"port to serve on (default $PORT, else {DEFAULT_UI_PORT})",
    )
    ui_p.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer release and replay (each previewed and confirmed, every one logged)",
    )
    ui_p.add_argument(
        "--iap-audience",
        metavar="AUD",
        help="refuse requests without Identity-Aware Proxy's signed header for this audience "
        "(Cloud Run: /projects/NUMBER/locations/REGION/services/NAME); the log names its user",
    )
    ui_p.add_argument(
        "--subscription",
        action="append",
        metavar="NAME",
        help="show this subscription's jobs too (repeatable; same collection and settings)",
    )


def cmd_ui(args: argparse.Namespace, out: Output) -> int:
    """``ui``: serve the dashboard until interrupted."""
    del out  # it logs; what it shows is in the browser
    settings = Settings.from_env()
    try:
        import uvicorn  # noqa: PLC0415 - the ui extra

        from pubsub_worker.ui import Jobs, create_app  # noqa: PLC0415 - the ui extra
        from pubsub_worker.ui.iap import IapVerifier  # noqa: PLC0415
        from pubsub_worker.ui.security import is_loopback  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(f"ui needs its extra: {install_line('ui')} ({exc})") from exc
    configure(settings.log_format)
    logging.getLogger("google").setLevel(logging.WARNING)
    names = [settings.subscription_path, *(args.subscription or [])]
    jobs = Jobs(settings, names)
    clients.check_firestore(jobs.client, settings)  # Unreachable: one line, exit 3
    loopback = is_loopback(args.host)
    iap = IapVerifier(args.iap_audience) if args.iap_audience else None
    app = create_app(jobs, allow_actions=args.allow_actions, loopback=loopback, iap=iap)
    mode = "actions allowed" if args.allow_actions else "read-only"
    _LOGGER.info(
        "jobs dashboard on http://%s:%d (%s) for %s",
        args.host if ":" not in args.host else f"[{args.host}]",
        args.port,
        mode,
        ", ".join(sub.path for sub in jobs.subscriptions),
    )
    if not loopback and iap is None:
        _LOGGER.warning(
            "serving on %s, not loopback: anyone who reaches it sees every job%s; put it "
            "behind Identity-Aware Proxy and give --iap-audience (docs/ui.md)",
            args.host,
            " and can release and replay them" if args.allow_actions else "",
        )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        jobs.close()
    return 0
