"""The distribution this package is installed as: its name on the package index, its version.

The distribution is ``pubsub-exactly-once`` (``pubsub-worker`` on the index is another,
older project); it installs the import package ``pubsub_worker`` and the
``pubsub-worker`` command. Every message that tells a user what to install is built
by :func:`install_line`, so that it names this distribution and nothing else.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["FALLBACK_VERSION", "NAME", "install_line", "installed_version"]

NAME = "pubsub-exactly-once"
"""The distribution's name on the package index (``pip install pubsub-exactly-once``)."""

FALLBACK_VERSION = "0.1.0"
"""``pyproject.toml``'s version: what a source tree on ``sys.path`` without an install reports."""


def installed_version() -> str:
    """The installed distribution's version, or :data:`FALLBACK_VERSION` when not installed."""
    try:
        return importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:
        return FALLBACK_VERSION


def install_line(extra: str) -> str:
    """The ``pip install`` command of one extra: ``pip install 'pubsub-exactly-once[push]'``."""
    return f"pip install '{NAME}[{extra}]'"
