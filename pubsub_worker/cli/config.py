"""``pubsub-worker config``: the effective settings and the live checks, as text or JSON.

The settings are :func:`pubsub_worker._ops.config_report.effective_settings`
(secrets masked), the checks :func:`pubsub_worker._ops.config_check.run_checks`.
Every problem is listed and the command exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, cast

from pubsub_worker._ops.config_check import Check, Level, run_checks
from pubsub_worker._ops.config_report import effective_settings
from pubsub_worker._support import clients
from pubsub_worker._support.logs import printable
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings

__all__ = ["cmd_config"]


def cmd_config(args: argparse.Namespace) -> int:
    """``config``: print the settings and the checks; 1 if any check found a problem."""
    try:
        settings = Settings.from_env()  # with the platform's defaults, reported as such below
    except ConfigError as exc:
        checks = [Check("settings", Level.PROBLEM, str(exc))]
        return _print_config(args, [], checks)
    rows = effective_settings(settings, os.environ)
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
    return _print_config(args, rows, checks, settings=settings)


def _admin_client() -> Any:
    from google.cloud import firestore_admin_v1  # noqa: PLC0415 - real Firestore only

    return firestore_admin_v1.FirestoreAdminClient()


def _print_config(
    args: argparse.Namespace,
    rows: list[Any],
    checks: list[Check],
    *,
    settings: Settings | None = None,
) -> int:
    problems = [c for c in checks if c.level is Level.PROBLEM]
    if args.json:
        document = {
            "settings": [
                {"variable": r.variable, "value": r.value, "source": r.source} for r in rows
            ],
            "checks": [c.to_json() for c in checks],
            "problems": len(problems),
        }
        print(json.dumps(document, indent=2, ensure_ascii=True))
        return 1 if problems else 0
    if rows:
        print("configuration")
        width = max(len(r.variable) for r in rows)
        for row in rows:
            print(f"  {row.variable:<{width}}  {printable(row.value, None)}  ({row.source})")
        print()
    where = f" of {settings.subscription_path}" if settings and settings.subscription else ""
    print(f"checks{where}")
    for check in checks:
        print(f"  {check.level.value.upper():<8} {check.name}: {printable(check.detail, None)}")
    print()
    if problems:
        print(f"{len(problems)} problem(s):")
        for check in problems:
            print(f"  - {check.name}: {printable(check.detail, None)}")
        return 1
    warnings = sum(1 for c in checks if c.level is Level.WARNING)
    print(f"no problems ({warnings} warning(s))")
    return 0
