"""Unit tests: the wrapper on the in-memory store (``world``), pure logic, no emulator."""

from __future__ import annotations

from tests.support.world import world

__all__ = ["world"]
