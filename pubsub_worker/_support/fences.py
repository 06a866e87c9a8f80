"""Switches that turn one fence of the protocol off, for tests against the emulators only.

A test of a fence must fail when that fence alone is removed. Each fence is
one check in the code, named here; its site asks whether the check is
switched off (``"commit" in fences.OFF``), and a must-fail test runs the race
the fence guards with it off and sees the violation:

================  =============================================  ==============================
fence             where, what it guards                          switched off
================  =============================================  ==============================
``generation``    ``DeliveryTracker.is_current``: only the       every delivery counts as
                  latest delivery of a message, not given up     current: a superseded one
                  nor refused by Pub/Sub, settles on Pub/Sub     runs on and settles
``adoption``      ``KeyGate.acquire`` and ``claim.claim``: a     the newer delivery takes the
                  newer delivery of a message running in this    key and the job over at once:
                  process waits for it and settles from the      the running step runs twice
                  record; it takes over only past the cap
``claim``         ``claim.claim``: create-if-absent, and the     the claim writes over the
                  compare-and-set on the version it decided on   document it finds now
``live-lease``    ``claim.decide``: another owner's lease that   a claim takes a running job
                  still runs makes the claim wait (busy)         over whatever its lease
``commit``        ``FencedDocument.write``: the version          a write uses the document's
                  precondition of the owner's writes             current version, unchecked
``transaction``   ``transact`` of every store (Firestore sync    the transaction commits
                  and async, memory): the job's version checked  whatever version it reads
                  in the transaction
``durable-ack``   ``DeliveryFlow``: the ack only once the        the ack goes out before the
                  completion is durable                          completion's write
``outbox``        ``JobCore.complete``: unsent outbox entries    the job completes with its
                  published before the completion                entries unsent
``review-mark``   ``FailurePath._mark_sent``: ``review: sent``   the mark is written on the
                  on the failed record's version (read again     version the job is at now
                  when refused: still that failure)
``expect-epoch``  ``jobs release --expect-epoch``: the release   the release lands at any
                  only while the job is at the epoch shown       epoch
================  =============================================  ==============================

The switch is read once, when this module is imported, from
``PUBSUB_WORKER_UNSAFE_DISABLE_FENCES`` (comma-separated names), so that a
test can start real worker processes with a fence off; in-process tests use
:func:`disabled`. It is honoured only when ``PUBSUB_EMULATOR_HOST`` and
``FIRESTORE_EMULATOR_HOST`` both name an emulator on this machine
(``HOST:PORT``, the host ``localhost`` or a loopback address, the port
1-65535; a placeholder such as ``unused`` is refused): anywhere else, as for
an unknown name, a worker refuses to start (:func:`check` raises
:class:`~pubsub_worker.errors.ConfigError`), and a worker that starts with a
fence off logs a warning naming it. With nothing switched off (production),
a fence site costs one lookup in an empty frozenset.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Literal, get_args

from pubsub_worker.errors import ConfigError

__all__ = ["ENV", "FENCES", "OFF", "Fence", "check", "disabled", "is_local_address", "parse"]

Fence = Literal[
    "generation",
    "adoption",
    "claim",
    "live-lease",
    "commit",
    "transaction",
    "durable-ack",
    "outbox",
    "review-mark",
    "expect-epoch",
]
"""The name of a fence that a test may switch off."""

FENCES: tuple[Fence, ...] = get_args(Fence)
"""Every fence, in the order a delivery meets them (the operator's last)."""

ENV = "PUBSUB_WORKER_UNSAFE_DISABLE_FENCES"
"""The variable naming the fences switched off (comma-separated), read once at import."""

EMULATORS = ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")
"""Both must name an emulator on this machine for a fence to be switched off."""

EMULATOR_ADDRESS = (
    "HOST:PORT, the host localhost, 127.0.0.1 (any 127.x.y.z) or [::1], the port 1-65535"
)
"""What :data:`EMULATORS` must hold, said in the refusal."""

_LOGGER = logging.getLogger("pubsub_worker")


def parse(environ: Mapping[str, str]) -> frozenset[Fence]:
    """The fences ``environ`` switches off (empty without :data:`ENV`).

    Raises :class:`~pubsub_worker.errors.ConfigError` for a name that is not
    a fence, and when a fence would be switched off without both emulators.
    """
    raw = environ.get(ENV, "")
    names = {name.strip() for name in raw.split(",")} - {""}
    if not names:
        return frozenset()
    unknown = sorted(names - set(FENCES))
    if unknown:
        raise ConfigError(
            f"{ENV}={raw!r}: unknown fence(s) {', '.join(unknown)} "
            f"(accepted: comma-separated names among {', '.join(FENCES)})"
        )
    _refuse_unless_emulated(environ)
    return frozenset(name for name in FENCES if name in names)


def _refuse_unless_emulated(environ: Mapping[str, str]) -> None:
    missing = [name for name in EMULATORS if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"{ENV}: refused: fences can only be switched off against the emulators "
            f"({' and '.join(missing)} not set)"
        )
    for name in EMULATORS:
        if not is_local_address(environ[name]):
            raise ConfigError(
                f"{ENV}: refused: fences can only be switched off against the emulators on "
                f"this machine: {name}={environ[name]!r} is not one ({EMULATOR_ADDRESS})"
            )


def is_local_address(value: str) -> bool:
    """Whether ``value`` is ``HOST:PORT`` of a server on this machine (a loopback host)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


try:
    OFF: frozenset[Fence] = parse(os.environ)
    """The fences switched off now (empty unless a test asked): a site reads
    ``"name" in fences.OFF``, a set lookup where a call would cost a frame on every delivery."""
    _refusal: ConfigError | None = None
except ConfigError as _error:
    OFF, _refusal = frozenset(), _error


def check() -> None:
    """At a worker's start: refuse a bad :data:`ENV`, and warn loudly of any fence switched off.

    Raises :class:`~pubsub_worker.errors.ConfigError` (an unknown name, or no emulators).
    """
    if _refusal is not None:
        raise _refusal
    if OFF:
        _warn(OFF)


@contextmanager
def disabled(*names: Fence) -> Iterator[None]:
    """Switch fences ``names`` off in this process for the block (an in-process test's twin).

    Raises :class:`~pubsub_worker.errors.ConfigError` for an unknown name or
    when the emulators' variables are not both set.
    """
    global OFF  # noqa: PLW0603 - the one switch every fence site reads
    wanted = parse({**os.environ, ENV: ",".join(names)})
    before = OFF
    OFF = before | wanted
    _warn(wanted)
    try:
        yield
    finally:
        OFF = before


def _warn(names: frozenset[Fence]) -> None:
    _LOGGER.warning(
        "UNSAFE: fence(s) %s switched off (%s): exactly-once processing is NOT guaranteed; "
        "this is for tests against the emulators only",
        ", ".join(name for name in FENCES if name in names),
        ENV,
    )
