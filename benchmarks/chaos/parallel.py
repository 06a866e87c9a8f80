"""Runs at the same time: each in a thread of its own, its progress lines prefixed.

Used for seeds run with ``--parallel`` and for the library and its baseline
runs of one seed (``--baseline --parallel``). Each run spawns its workers
from its own thread, which outlives them: the parent-death signal of a
worker follows the thread that started it (see :mod:`benchmarks.chaos.fleet`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

__all__ = ["Prefixed", "Stream", "run_threads"]

T = TypeVar("T")


class Stream(Protocol):
    """A text stream: where progress goes."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class Prefixed:
    """A text stream that writes whole lines to ``target``, each after ``prefix``."""

    _lock = threading.Lock()  # one line at a time on the shared target

    def __init__(self, target: Stream, prefix: str) -> None:
        self._target = target
        self._prefix = prefix
        self._partial = ""

    def write(self, text: str) -> int:
        """Buffer ``text``; write every line it completes."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        with self._lock:
            for line in lines:
                if line.strip():
                    self._target.write(f"{self._prefix}{line}\n")
            self._target.flush()
        return len(text)

    def flush(self) -> None:
        """Flush the target (a partial line waits for its end)."""
        self._target.flush()


def run_threads(
    calls: Sequence[Callable[[], T]], names: Sequence[str], stop: threading.Event
) -> list[T]:
    """Run every call in its own thread; return their results in order.

    The first exception of a call sets ``stop`` (every run watches it and
    stops) and is raised once all threads ended. Ctrl-C sets ``stop`` too,
    waits up to 60 s for each thread, then propagates.
    """
    results: dict[int, T] = {}
    failures: list[BaseException] = []

    def one(index: int, call: Callable[[], T]) -> None:
        try:
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            failures.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=one, args=(index, call), name=name)
        for index, (call, name) in enumerate(zip(calls, names, strict=True))
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join(60)
        raise
    if failures:
        raise failures[0]
    return [results[index] for index in range(len(calls))]
