"""What ``pubsub-worker config`` reports: the settings, their sources, masks.

:func:`effective_settings` lists every setting with its value and where it
came from (the environment, the default, or a platform default), then the
derived paths and the credentials in use. :func:`mask` hides secrets and
URL passwords before anything is shown. The platform defaults themselves
(:func:`platform_overrides`: on Cloud Run, :func:`cloud_run`, the shutdown
grace is :data:`CLOUD_RUN_GRACE_S`) live in :mod:`pubsub_worker.settings`,
which :meth:`~pubsub_worker.settings.Settings.from_env` applies; they are
re-exported here.

The Firestore set-up the job layout needs is :mod:`pubsub_worker.stores.layout`;
the checks against Pub/Sub and Firestore are :mod:`pubsub_worker._ops.config_check`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretBytes, SecretStr

from pubsub_worker._variables import env_name
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import (
    CLOUD_RUN_GRACE_S,
    Settings,
    cloud_run,
    platform_overrides,
)

__all__ = [
    "CLOUD_RUN_GRACE_S",
    "SettingRow",
    "cloud_run",
    "effective_settings",
    "mask",
    "platform_overrides",
]

_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|private", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]*(?=@)", re.IGNORECASE)
_MASK = "********"


@dataclass(frozen=True)
class SettingRow:
    """One setting as in effect: the variable, its value as shown, and where it came from."""

    variable: str
    value: str
    source: str
    """``environment``, ``default``, or the reason of a platform default (``Cloud Run``)."""


def mask(name: str, value: Any) -> str:
    """``value`` as ``config`` may print it: secrets and URL passwords masked."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):  # a switch, even one named for a token, is no secret
        return str(value)
    if isinstance(value, (SecretStr, SecretBytes)) or (_SECRET_NAME.search(name) and value):
        return _MASK
    return _URL_PASSWORD.sub(lambda m: m.group("head") + _MASK, str(value))


def effective_settings(
    settings: Settings,
    environ: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
) -> list[SettingRow]:
    """Every setting with its value and source, then the derived paths and credentials.

    ``overrides`` are the platform defaults in effect (a setting among them is
    reported as ``<marker variable> default``); None: those of ``environ``, as
    :meth:`Settings.from_env` applied them. ``flags`` maps a setting given by a
    command-line flag to that flag (``{"subscription": "--subscription"}``),
    reported as its source.
    """
    overrides = platform_overrides(environ) if overrides is None else overrides
    flags = flags or {}
    rows = []
    for field in type(settings).model_fields:
        variable = env_name(field)
        if field in flags:
            source = flags[field]
        elif field in overrides:
            source = f"{cloud_run(environ) or 'platform'} default"
        elif variable in environ:
            source = "environment"
        else:
            source = "default"
        rows.append(SettingRow(variable, mask(variable, getattr(settings, field)), source))
    derived: list[tuple[str, Callable[[], str | None]]] = [
        ("subscription path", lambda: settings.subscription_path),
        ("project", lambda: settings.project_id),
        ("failure topic path", lambda: settings.failure_topic_path),
    ]
    for label, read in derived:
        try:
            value = read()
        except ConfigError as exc:
            value = f"({exc})"
        rows.append(SettingRow(label, mask(label, value), "derived"))
    credentials = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if settings.pubsub_emulator_host or settings.firestore_emulator_host:
        how = "none needed by the emulators"
    elif credentials:
        how = f"key file {credentials} (GOOGLE_APPLICATION_CREDENTIALS; its contents not shown)"
    else:
        how = "application default credentials (metadata server or gcloud auth)"
    rows.append(SettingRow("credentials", how, "derived"))
    return rows
