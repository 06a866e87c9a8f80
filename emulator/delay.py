"""Holding bytes back for a set time, in order: the delay of :meth:`emulator.TcpProxy.delay`.

A :class:`DelayLine` holds the chunks on their way to one socket, each with
the moment it may go, in the order they were read; the proxy's loop hands
them on when their moment comes.
"""

from __future__ import annotations

from collections import deque

__all__ = ["DelayLine"]


class DelayLine:
    """Chunks of bytes held until their moment, oldest first. Not thread-safe: one owner."""

    def __init__(self) -> None:
        self._chunks: deque[tuple[float, bytes]] = deque()
        self.size = 0
        """Bytes held."""

    def hold(self, data: bytes, until: float) -> None:
        """Keep ``data`` until the monotonic time ``until``."""
        self._chunks.append((until, data))
        self.size += len(data)

    def release(self, now: float) -> bytes:
        """The chunks whose moment came by ``now``, joined, in order.

        A chunk never overtakes one held before it, even with an earlier
        moment (the delay was shortened meanwhile): order is what TCP promises.
        """
        out = bytearray()
        while self._chunks and self._chunks[0][0] <= now:
            out += self._chunks.popleft()[1]
        self.size -= len(out)
        return bytes(out)

    @property
    def due(self) -> float | None:
        """The moment the oldest chunk may go (None: nothing held)."""
        return self._chunks[0][0] if self._chunks else None

    def __bool__(self) -> bool:
        return bool(self._chunks)
