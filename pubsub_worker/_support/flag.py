"""A flag set once and read from any thread, for signals nobody waits on."""

from __future__ import annotations

__all__ = ["Flag"]


class Flag:
    """``threading.Event``'s ``set()`` and ``is_set()``, without its condition and lock.

    For a per-delivery signal that threads read and set but never wait for
    (a delivery lost, a job abandoned): an ``Event`` builds a ``Condition``
    and an ``RLock`` per delivery for a ``wait()`` never called. Setting and
    reading one attribute is atomic under the interpreter lock, as the
    ``Event``'s own flag is.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        """Set the flag (for good)."""
        self._set = True

    def is_set(self) -> bool:
        """Whether the flag was set."""
        return self._set
