"""Write ids: the ``write_id`` a Firestore store puts in each write to recognise it later.

A write whose outcome is unknown (the RPC failed or timed out) is settled by
reading its document back: the write landed iff the document holds its
``write_id``. So an id must never repeat, across the processes that write
one job. Each is a random prefix drawn once per process (again in a forked
child, which would otherwise repeat its parent's ids) and a counter: 128
bits, 32 hex digits, like the ``uuid4().hex`` it replaces, without a system
call per write (``os.urandom`` per ``uuid4`` lets go of the GIL, a hand-off
between threads when callbacks run side by side).
"""

from __future__ import annotations

import itertools
import os

__all__ = ["new_write_id"]


def _reseed() -> None:
    global _prefix, _counter  # noqa: PLW0603 - one generator per process, reset on fork
    _prefix = os.urandom(8).hex()
    _counter = itertools.count()


_prefix: str
_counter: itertools.count[int]
_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_write_id() -> str:
    """A write id no other write of any process has had (thread-safe: ``count`` is atomic)."""
    return f"{_prefix}{next(_counter):016x}"
