"""Helpers for the harness tests: look at processes through /proc."""

from __future__ import annotations

import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid pgrp ...": comm may contain spaces, split after it.
    return raw[raw.rindex(")") + 2 :].split()


def running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def children(ppid: int) -> list[int]:
    """Live processes whose parent is ``ppid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[1]) == ppid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid``, space-separated ('' if gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """Wait until no pid in ``pids`` runs; return those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
