"""A finding of ``pubsub-worker config``: what was checked, how much it matters, and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Check", "Level"]


class Level(str, Enum):
    """How much a check's finding matters."""

    OK = "ok"
    """As it should be."""
    PROBLEM = "problem"
    """The worker would refuse to start, or lose or mishandle messages: fix it."""
    WARNING = "warning"
    """Works, with a cost the operator should know about."""
    HINT = "hint"
    """Something to set up outside the worker (or that could not be checked)."""


@dataclass(frozen=True)
class Check:
    """One finding."""

    name: str
    level: Level
    detail: str

    def to_json(self) -> dict[str, str]:
        """``{"check", "level", "detail"}``."""
        return {"check": self.name, "level": self.level.value, "detail": self.detail}
