"""A delivery's objects are freed as it ends: by reference counting, not the cyclic collector.

A reference cycle among a delivery's objects (its job, its fenced document, a
callback bound to either) keeps all of them until the next collection, and
its allocations trigger more collections: CPU per message the wrapper pays
under load (``docs/benchmarks-history.md``, fifth pass). These deliveries leave none.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pubsub_worker
from tests.support.world import FakeMessage, World


@pytest.fixture
def cyclic_garbage() -> Iterator[Callable[[], list[Any]]]:
    """What the collector finds unreachable from here on (kept, not freed, to be counted)."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    del gc.garbage[:]

    def found() -> list[Any]:
        gc.collect()
        return list(gc.garbage)

    try:
        yield found
    finally:
        del gc.garbage[:]
        gc.set_debug(flags)


def _steps(message: Any, job: pubsub_worker.Job) -> None:
    job.step("one", lambda: 1)
    job.step("two", lambda: {"paid": 2})


def test_completed_deliveries_leave_no_cycle(
    world: Callable[..., World], cyclic_garbage: Callable[[], list[Any]]
) -> None:
    w = world(_steps)
    w.deliver(FakeMessage(op="warm-up"))  # first-time paths (caches, lazy imports) out of it
    cyclic_garbage()
    del gc.garbage[:]
    for n in range(20):
        assert w.deliver(FakeMessage(op=f"k{n}")) == "ack"
    assert w.deliver(FakeMessage(op="k0")) == "ack"  # a completed job, redelivered
    # The library's own objects only: another test's threads, still running in a one-process
    # session, may leave garbage of their own meanwhile.
    left = {
        type(o).__qualname__
        for o in cyclic_garbage()
        if type(o).__module__.startswith("pubsub_worker")
    }
    assert not left, sorted(left)
