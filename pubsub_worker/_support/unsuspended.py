"""One body of code for a synchronous and an ``async def`` caller: a coroutine run to its end
on the calling thread when it never suspends.

A transaction's rounds are written once, as a coroutine that awaits its body; the
synchronous caller hands it a body that awaits nothing and runs it with
:func:`run_unsuspended`, without an event loop (the job's fenced document and the
in-memory store both do).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_unsuspended"]

T = TypeVar("T")


def run_unsuspended(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``, whose awaits are plain calls, on this thread; its result.

    ``RuntimeError`` if it suspends after all (it awaited something that waits): a
    synchronous caller has no loop to resume it on.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a coroutine run without an event loop suspended")
