"""The batcher's flusher pool (``Flushers``): how many threads it starts, and which are free."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from pubsub_worker.stores._flushers import Flushers


@pytest.fixture
def pool() -> Iterator[tuple[Flushers, threading.Event]]:
    """A pool whose threads run until the event is set, then leave."""
    release = threading.Event()

    def run() -> None:
        release.wait(10)
        flushers.leave()

    flushers = Flushers(run)
    yield flushers, release
    release.set()
    for thread in list(flushers.threads):
        thread.join(5)


def test_it_starts_up_to_most_threads_and_no_more(pool: tuple[Flushers, threading.Event]) -> None:
    flushers, _ = pool
    flushers.top_up(3, handed=0)
    assert len(flushers) == 3
    flushers.top_up(3, handed=0)
    assert len(flushers) == 3
    assert len({t.name for t in flushers.threads}) == 3
    assert all(t.name.startswith("pubsub-worker-batch-writer-") for t in flushers.threads)


def test_a_carrying_flusher_is_replaced_for_batches(pool: tuple[Flushers, threading.Event]) -> None:
    flushers, _ = pool
    flushers.top_up(2, handed=0)
    flushers.carrying = 1
    flushers.top_up(2, handed=0)
    assert len(flushers) == 3  # two take batches while one carries on


def test_handed_writes_get_a_thread_when_no_flusher_waits(
    pool: tuple[Flushers, threading.Event],
) -> None:
    """Every flusher busy sending: a continuation handed on would wait for a round trip."""
    flushers, _ = pool
    flushers.top_up(2, handed=0)
    flushers.top_up(2, handed=1)
    assert len(flushers) == 3
    flushers.waiting = 2
    flushers.top_up(2, handed=2)
    assert len(flushers) == 3  # each waiting flusher takes one


def test_a_waiting_flusher_is_counted_while_it_waits() -> None:
    flushers = Flushers(lambda: None)
    condition = threading.Condition()
    seen: list[int] = []

    def waiter() -> None:
        with condition:
            flushers.wait(condition, 5)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 5
    while flushers.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    with condition:
        seen.append(flushers.waiting)
        condition.notify()
    thread.join(5)
    assert seen == [1]
    assert flushers.waiting == 0


def test_the_pool_ends_its_threads_as_they_leave(pool: tuple[Flushers, threading.Event]) -> None:
    flushers, release = pool
    flushers.top_up(2, handed=0)
    release.set()
    deadline = time.monotonic() + 5
    while len(flushers) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(flushers) == 0
