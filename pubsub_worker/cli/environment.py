"""What every ``pubsub-worker`` command takes from its environment and its common flags.

The settings are ``PUBSUB_WORKER_*`` and the other variables
(:meth:`~pubsub_worker.settings.Settings.from_env`); an operator's command
(``config``, ``jobs ...``) also takes ``--subscription`` and ``--project``,
which win over ``PUBSUB_WORKER_SUBSCRIPTION`` and ``GOOGLE_CLOUD_PROJECT``
(:func:`add_operator_options`), so one shell can look at another
subscription. A bad value names the flag it came from.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from pubsub_worker._support import clients
from pubsub_worker._support.logs import configure
from pubsub_worker._variables import env_name
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings
from pubsub_worker.stores import FirestoreJobStore

__all__ = [
    "OUTPUTS",
    "add_operator_options",
    "flags_given",
    "job_store",
    "settings_from",
    "worker_settings",
]

OUTPUTS = ("text", "json")
"""What ``--output`` takes: ``text`` (a table on a terminal, plain lines when piped) or JSON."""

_FLAGS = {"subscription": "--subscription", "project": "--project"}
_VARIABLES = {"subscription": env_name("subscription"), "project": "GOOGLE_CLOUD_PROJECT"}


def add_operator_options(parser: argparse.ArgumentParser) -> None:
    """``--subscription``, ``--project`` and ``--output`` on an operator's command."""
    parser.add_argument(
        "--subscription",
        metavar="SUB",
        help="the subscription: an ID or projects/P/subscriptions/S "
        f"(default ${env_name('subscription')})",
    )
    parser.add_argument(
        "--project",
        help="the Google Cloud project (default $GOOGLE_CLOUD_PROJECT, else the subscription's)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="text",
        help="text (default) or json, for scripts",
    )


def flags_given(args: argparse.Namespace) -> dict[str, str]:
    """The settings the command's flags give: ``{"subscription": "--subscription"}``, say."""
    return {name: flag for name, flag in _FLAGS.items() if getattr(args, name, None)}


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of the environment, with the command's ``--subscription`` and ``--project``.

    Raises :class:`~pubsub_worker.errors.ConfigError`; a bad flag's message
    names the flag, not the variable it stands in for.
    """
    overrides: dict[str, Any] = {name: getattr(args, name) for name in flags_given(args)}
    try:
        return Settings.from_env(**overrides)
    except ConfigError as exc:
        message = str(exc)
        for name in overrides:
            message = message.replace(_VARIABLES[name], _FLAGS[name])
        if message == str(exc):
            raise
        raise ConfigError(message) from exc


def worker_settings(args: argparse.Namespace) -> Settings:
    """``run`` and ``push``: the settings, and the logging they configure (text or JSON lines)."""
    settings = settings_from(args)
    configure(settings.log_format)
    logging.getLogger("google").setLevel(logging.WARNING)
    return settings


def job_store(settings: Settings) -> FirestoreJobStore:
    """The job store the commands read and write (one write at a time: no batching needed).

    One read first, so that a Firestore that does not answer is one line
    (:class:`~pubsub_worker.errors.Unreachable`, after retrying for up to
    10 s) rather than a command that hangs in the client's retries.
    """
    client = clients.firestore_client(settings)
    clients.check_firestore(client, settings)
    return FirestoreJobStore(client, settings.collection)
