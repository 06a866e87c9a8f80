"""``pubsub-worker config``: the effective settings and the live checks, as text or JSON.

The settings are :func:`pubsub_worker._ops.config_report.effective_settings`
(secrets masked), the checks :func:`pubsub_worker._ops.config_check.run_checks`.
Every problem is listed and the command exits 1 if there is any. On a
terminal the settings are a table and each finding's level has its colour
(:mod:`pubsub_worker.cli.output`); piped, the lines are as below::

    configuration
      PUBSUB_WORKER_SUBSCRIPTION  projects/p/subscriptions/s  (environment)
      ...

    checks of projects/p/subscriptions/s
      OK       subscription: ...
      PROBLEM  failure topic: ...

    1 problem(s):
      - failure topic: ...
"""

from __future__ import annotations

import argparse
import os
from typing import Any, cast

from pubsub_worker._ops.config_check import Check, Level, run_checks
from pubsub_worker._ops.config_report import effective_settings
from pubsub_worker._support import clients
from pubsub_worker._support.logs import printable
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings

from .environment import add_operator_options, flags_given, settings_from
from .exit_codes import ExitCode
from .output import LEVEL_STYLES, Column, Output

__all__ = ["cmd_config", "register"]


def register(commands: Any) -> None:
    """Add ``config`` to the command's subparsers."""
    parser = commands.add_parser("config", help="the effective settings, checked against the cloud")
    add_operator_options(parser)
    parser.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace, out: Output) -> int:
    """``config``: print the settings and the checks; 1 if any check found a problem."""
    try:
        settings = settings_from(args)  # with the platform's defaults, reported as such below
    except ConfigError as exc:  # a finding here, not the command's failure
        checks = [Check("settings", Level.PROBLEM, str(exc))]
        return _print_config(args, out, [], checks)
    rows = effective_settings(settings, os.environ, flags=flags_given(args))
    opened: list[Any] = []  # the clients' close methods are untyped; they release channels
    try:
        subscriber = clients.subscriber_client(settings)
        opened.append(subscriber)
        publisher = clients.publisher_client(settings)
        opened.append(cast(Any, publisher).transport)
        firestore_client = clients.firestore_client(settings)
        opened.append(firestore_client)
        admin = None if settings.firestore_emulator_host else _admin_client
        checks = run_checks(
            settings,
            subscriber=subscriber,
            publisher=publisher,
            firestore_client=firestore_client,
            admin=admin,
        )
    except ConfigError as exc:  # no credentials: the settings still print, with what to set
        checks = [Check("credentials", Level.PROBLEM, str(exc))]
    finally:
        for client in opened:
            client.close()
    return _print_config(args, out, rows, checks, settings=settings)


def _admin_client() -> Any:
    from google.cloud import firestore_admin_v1  # noqa: PLC0415 - real Firestore only

    return firestore_admin_v1.FirestoreAdminClient()


def _print_config(
    args: argparse.Namespace,
    out: Output,
    rows: list[Any],
    checks: list[Check],
    *,
    settings: Settings | None = None,
) -> int:
    problems = [c for c in checks if c.level is Level.PROBLEM]
    code = ExitCode.FAILED if problems else ExitCode.OK
    if args.output == "json":
        out.document(
            {
                "settings": [
                    {"variable": r.variable, "value": r.value, "source": r.source} for r in rows
                ],
                "checks": [c.to_json() for c in checks],
                "problems": len(problems),
            }
        )
        return code
    if rows:
        out.line("configuration", style="bold")
        table = [(r.variable, printable(r.value, None), f"({r.source})") for r in rows]
        if out.terminal:
            out.table([Column("VARIABLE"), Column("VALUE"), Column("SOURCE")], table)
        else:
            width = max(len(r.variable) for r in rows)
            for variable, value, source in table:
                out.line(f"  {variable:<{width}}  {value}  {source}")
        out.line()
    where = f" of {settings.subscription_path}" if settings and settings.subscription else ""
    out.line(f"checks{where}", style="bold")
    for check in checks:
        level = check.level.value
        out.line(
            f"  {level.upper():<8} {check.name}: {printable(check.detail, None)}",
            style=LEVEL_STYLES.get(level),
        )
    out.line()
    if problems:
        out.line(f"{len(problems)} problem(s):", style=LEVEL_STYLES["problem"])
        for check in problems:
            out.line(f"  - {check.name}: {printable(check.detail, None)}")
        return code
    warnings = sum(1 for c in checks if c.level is Level.WARNING)
    out.line(f"no problems ({warnings} warning(s))", style=LEVEL_STYLES["ok"])
    return code
