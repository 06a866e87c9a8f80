"""The batcher's flusher threads: how many there are, and which of them are free.

A flusher sends the queued writes no caller's thread sent. One that carries on
continued writes (its own batch's, or those another caller's thread handed on)
takes no batch meanwhile, and one that waits on the batcher's condition is free
to take handed writes: :class:`Flushers` counts both, so that the batcher starts
another thread when every flusher is busy, and never more than needed. The
batcher's condition guards it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Flushers"]


class Flushers:
    """The flusher threads of one batcher, each running ``run`` until it ends."""

    def __init__(self, run: Callable[[], None]) -> None:
        self._run = run
        self._started = 0
        self.threads: list[threading.Thread] = []
        self.carrying = 0
        """Flushers carrying on continued writes: not taking batches."""
        self.waiting = 0
        """Flushers waiting on the batcher's condition: free to take handed writes."""

    def __len__(self) -> int:
        return len(self.threads)

    def top_up(self, most: int, handed: int) -> None:
        """Start flushers until ``most`` of them take batches, and one more if the ``handed``
        lists of continued writes outnumber the waiting flushers (the others send RPCs)."""
        while len(self.threads) - self.carrying < most:
            self._start()
        if handed > self.waiting:
            self._start()

    def _start(self) -> None:
        self._started += 1
        name = f"pubsub-worker-batch-writer-{self._started}"
        thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def wait(self, condition: threading.Condition, timeout_s: float) -> bool:
        """A flusher's wait on the batcher's ``condition``, counted as waiting."""
        self.waiting += 1
        try:
            return condition.wait(timeout_s)
        finally:
            self.waiting -= 1

    def leave(self) -> None:
        """The calling flusher ends."""
        me = threading.current_thread()
        if me in self.threads:
            self.threads.remove(me)
