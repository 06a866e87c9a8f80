"""The exit codes of the ``pubsub-worker`` command; the table is in :mod:`pubsub_worker.cli`."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    """The ``pubsub-worker`` command's exit status (the table in :mod:`pubsub_worker.cli`)."""

    OK = 0
    FAILED = 1
    """Part of what was asked was not done (a job not replayed, a problem ``config`` found)."""
    USAGE = 2
    """A bad argument or configuration (a handler path, a port in use, a setting)."""
    UNREACHABLE = 3
    """Pub/Sub or Firestore did not answer, or failed."""
    NOT_FOUND = 4
    """A job key that no job has on the subscription."""
    INTERNAL = 70
    """A bug (``EX_SOFTWARE``); ``--traceback`` shows where."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT) outside ``run`` and ``push``."""
    PIPE_CLOSED = 141
    """stdout was closed early (128 + SIGPIPE, as a program killed by it)."""
