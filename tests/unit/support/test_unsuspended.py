"""``run_unsuspended``: a coroutine that awaits nothing that waits, run without a loop."""

from __future__ import annotations

import asyncio

import pytest

from pubsub_worker._support.unsuspended import run_unsuspended


def test_a_coroutine_whose_awaits_are_plain_calls_gives_its_result() -> None:
    async def plain(n: int) -> int:
        return n + 1

    async def rounds() -> list[int]:
        return [await plain(n) for n in range(3)]

    assert run_unsuspended(rounds()) == [1, 2, 3]


def test_its_exception_comes_back_as_it_is() -> None:
    async def failing() -> None:
        raise KeyError("the body's own")

    with pytest.raises(KeyError, match="the body's own"):
        run_unsuspended(failing())


def test_a_coroutine_that_suspends_is_refused_and_closed() -> None:
    finished: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(0)  # yields to a loop there is none of
        finally:
            finished.append("closed")

    with pytest.raises(RuntimeError, match="suspended"):
        run_unsuspended(waits())
    assert finished == ["closed"]  # its finally ran: nothing left pending
