"""The ``pubsub-worker`` command: run a worker, check its configuration, inspect and fix jobs.

::

    pubsub-worker run package.module:handler      consume PUBSUB_WORKER_SUBSCRIPTION
        [--metrics-port N] [--processes N]        Prometheus + health; N worker processes
    pubsub-worker push package.module:handler     serve a push subscription's requests
        [--host H] [--port N] [--metrics-port N]  POST /, /livez, /readyz (uvicorn)
    pubsub-worker config                          the effective settings, checked live
    pubsub-worker jobs show KEY                   one job: status, owner, lease, steps, outbox
    pubsub-worker jobs list [--status S] [--older-than 10m] [--limit N] [--after CURSOR]
    pubsub-worker jobs stats                      jobs per status, oldest running, pending reviews
    pubsub-worker jobs release KEY [--epoch N]    drop a stuck owner's claim (fenced)
    pubsub-worker jobs replay KEY... | --all-failed [--dry-run] [--fan-out | --topic T]
    pubsub-worker jobs replay-setup               the replay topic: replays reach this subscription
    pubsub-worker ui [--allow-actions]            the jobs dashboard (the ui extra)
    pubsub-worker --version

``config`` and every ``jobs`` command also take ``--subscription SUB`` and
``--project P`` (over ``PUBSUB_WORKER_SUBSCRIPTION`` and
``GOOGLE_CLOUD_PROJECT``) and ``-o/--output json`` for scripts. Settings come
from ``PUBSUB_WORKER_*`` variables (on Cloud Run the shutdown grace defaults
to 5 s, see :mod:`pubsub_worker._ops.config_report`). On a terminal tables,
colours and the replay's progress bar come through rich; piped, the output
is plain, stable text (:mod:`pubsub_worker.cli.output`). Stored strings (keys,
errors) are shown through :func:`pubsub_worker._support.logs.printable`: a key
cannot forge a line or send terminal escapes.

Every failure is one line on stderr, ``pubsub-worker: <what>``, and one of
these exit codes (:class:`~pubsub_worker.cli.exit_codes.ExitCode`), never a
traceback (``--traceback`` shows one for an internal error):

=====  ==================================================================
code   meaning
=====  ==================================================================
0      done as asked (``run`` and ``push``: stopped by SIGTERM or SIGINT)
1      part of what was asked was not done: a job not replayed or not
       released, a problem ``config`` found, a worker process that died
2      usage or configuration: a bad argument, a setting out of range, a
       handler path that does not load, a port in use, no credentials, a
       missing Firestore index, a subscription that does not exist
3      Pub/Sub or Firestore did not answer or failed (the store is down,
       the streaming pull ended with an error)
4      not found: a job key that no job has on the subscription
70     an internal error (a bug): ``--traceback`` shows where
130    interrupted (Ctrl-C) outside ``run`` and ``push``
141    stdout was closed early (``| head``): the rest is dropped quietly
=====  ==================================================================

Each command is a module with ``register(subparsers)``, which adds its parser
and ``set_defaults(func=cmd)``; ``cmd(args, out)`` returns the exit code.
:data:`COMMANDS` lists them.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from typing import NoReturn

from google.api_core import exceptions as gexc

from pubsub_worker._support.distribution import NAME, installed_version
from pubsub_worker.errors import ConfigError, PubSubWorkerError, StoreError, Unreachable
from pubsub_worker.stores.layout import IndexMissing

from . import config, jobs, push, run, ui
from .exit_codes import ExitCode
from .output import Output

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = (run, push, config, jobs, ui)
"""The command modules, in the order ``--help`` lists them."""

_REQUEST_REFUSED = (
    gexc.PermissionDenied,
    gexc.Unauthenticated,
    gexc.NotFound,
    gexc.InvalidArgument,
)
"""Google Cloud errors that say what was asked is wrong: configuration (exit 2), not an outage."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"pubsub-worker: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = _Parser(
        prog="pubsub-worker",
        description="Exactly-once Pub/Sub worker (settings: PUBSUB_WORKER_*)",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"pubsub-worker {installed_version()} ({NAME}, Python {platform.python_version()})",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the traceback of an internal error"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pubsub-worker`` command: the exit code (see the module's table)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, a usage error: already written
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    out = Output()
    try:
        code = int(args.func(args, out))
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        return ExitCode.PIPE_CLOSED
    except KeyboardInterrupt:
        out.error("interrupted")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        if _interrupted(exc):
            out.error("interrupted")
            return ExitCode.INTERRUPTED
        code = _exit_code(exc)
        if code is ExitCode.INTERNAL and args.traceback:
            raise
        out.error(_message(exc, code))
        return code
    return code


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a Ctrl-C was on its way out.

    A ``KeyboardInterrupt`` that lands inside a lock's ``with`` block or a
    ``Condition.wait`` (a gRPC call waiting for its answer) can leave that
    code releasing a lock it no longer holds; the ``RuntimeError`` it raises
    then replaces the interrupt, which stays its context.
    """
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, KeyboardInterrupt):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False


def _exit_code(exc: Exception) -> ExitCode:
    if isinstance(exc, (ConfigError, IndexMissing, *_REQUEST_REFUSED)):
        return ExitCode.USAGE
    if isinstance(exc, (Unreachable, StoreError, gexc.GoogleAPICallError, gexc.RetryError)):
        return ExitCode.UNREACHABLE
    if isinstance(exc, PubSubWorkerError):
        return ExitCode.FAILED
    return ExitCode.INTERNAL


def _message(exc: Exception, code: ExitCode) -> str:
    if isinstance(exc, PubSubWorkerError):
        return str(exc)
    if code is ExitCode.INTERNAL:
        return (
            f"internal error: {type(exc).__name__}: {exc} (a bug; run again with --traceback "
            "to see where)"
        )
    return f"Google Cloud answered {type(exc).__name__}: {exc}"


def _drop_stdout() -> None:
    """The reader went away: point stdout at /dev/null, so that the exit writes nothing.

    As Python's documentation of SIGPIPE advises: flushing stdout at exit would
    raise BrokenPipeError again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's capture): nothing to flush
        pass
