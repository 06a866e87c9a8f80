"""Hold a worker process at a named point until the test releases it.

A worker started with ``CHAOS_GATES=step:b`` stops inside step ``b`` (before
its effect), creates ``<effects>.gate-step_b.at`` and waits until the test
creates ``<effects>.gate-step_b.go``. A gate holds once per test (the first
worker that reaches it), so a redelivery in another worker runs through.
The test uses the pause to fault the world deterministically: pause the
process, cut or blackhole its connection, send it SIGTERM.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

HOLD_LIMIT_S = 300.0
"""A gate never holds longer than this (a test that forgot to release it)."""


_POLL_S = 0.02


def gate_files(effects: str | Path, point: str) -> tuple[Path, Path]:
    """The ``(arrived, go)`` marker files of ``point`` next to the effects file."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", point)
    base = f"{effects}.gate-{slug}"
    return Path(base + ".at"), Path(base + ".go")


def hold(effects: str | Path, point: str) -> None:
    """Worker side: announce arrival at ``point`` and wait for the release (once per test)."""
    arrived, go = gate_files(effects, point)
    try:
        fd = os.open(arrived, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # another worker (or an earlier delivery) held here already
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    # Counted polls, not a clock: a worker under libfaketime must hold just as long.
    for _ in range(int(HOLD_LIMIT_S / _POLL_S)):
        if go.exists():
            return
        time.sleep(_POLL_S)


@dataclass
class Gate:
    """Test side of a gate."""

    effects: Path
    point: str

    def wait_arrived(self, timeout_s: float = 60) -> int:
        """Wait until a worker holds at the gate; return its pid."""
        arrived, _ = gate_files(self.effects, self.point)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if arrived.exists() and (text := arrived.read_text()):
                return int(text)
            time.sleep(0.05)
        raise AssertionError(f"no worker reached gate {self.point!r} within {timeout_s} s")

    def release(self) -> None:
        """Let the held worker go on."""
        _, go = gate_files(self.effects, self.point)
        go.touch()
