"""The machine and its CPU: accounting from ``/proc``, versions, the emulators' session."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["CpuMark", "cpu_between", "emulators", "machine", "mark", "versions"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from ``/proc`` (0 when unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def _machine_jiffies() -> tuple[int, int, int]:
    """(busy, total, stolen) jiffies of all CPUs, from ``/proc/stat``.

    Stolen: the time the hypervisor ran something else (another machine on
    the host) while this one had work, counted in busy.
    """
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return (0, 0, 0)
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    stolen = values[7] if len(values) > 7 else 0
    return (sum(values) - idle, sum(values), stolen)


@dataclass(frozen=True)
class CpuMark:
    """CPU counters at one moment: the emulators', the machine's, this process's."""

    at: float
    emulators: Mapping[str, float]
    machine: tuple[int, int, int]
    orchestrator: float


def mark(pids: Mapping[str, int]) -> CpuMark:
    """The counters now, for the emulator processes ``pids`` (name -> pid)."""
    return CpuMark(
        at=time.monotonic(),
        emulators={name: process_cpu_s(pid) for name, pid in pids.items()},
        machine=_machine_jiffies(),
        orchestrator=time.process_time(),
    )


def cpu_between(start: CpuMark, end: CpuMark) -> dict[str, float]:
    """CPU seconds used between two marks, per emulator, by the machine and by us."""
    out = {f"{n}_emulator_s": end.emulators[n] - start.emulators[n] for n in start.emulators}
    busy = end.machine[0] - start.machine[0]
    total = end.machine[1] - start.machine[1]
    out["machine_busy"] = busy / total if total else 0.0
    out["machine_busy_s"] = busy / _CLK_TCK
    out["stolen_s"] = (end.machine[2] - start.machine[2]) / _CLK_TCK
    out["orchestrator_s"] = end.orchestrator - start.orchestrator
    out["wall_s"] = end.at - start.at
    return out


def versions(sdk_root: Path | None) -> dict[str, str]:
    """Versions of the clients and, from the SDK's install records, of the emulators."""
    found: dict[str, str] = {}
    for dist in ("google-cloud-pubsub", "google-cloud-firestore", "grpcio", "protobuf"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "?"
    if sdk_root is not None:
        for component, name in (
            ("pubsub-emulator", "Pub/Sub emulator"),
            ("cloud-firestore-emulator", "Firestore emulator"),
        ):
            try:
                snapshot = json.loads(
                    (sdk_root / ".install" / f"{component}.snapshot.json").read_text()
                )
                entry = next(c for c in snapshot["components"] if c["id"] == component)
                found[name] = entry["version"]["version_string"]
            except (OSError, ValueError, KeyError, StopIteration):
                found[name] = "?"
        try:
            found["Google Cloud CLI"] = (sdk_root / "VERSION").read_text().strip()
        except OSError:
            found["Google Cloud CLI"] = "?"
    return found


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python and kernel."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


@contextmanager
def emulators(project: str) -> Iterator[tuple[Any, Path | None]]:
    """Both emulators for the session, and the SDK root they came from (None: Docker)."""
    from emulator import find_components, start_emulators  # noqa: PLC0415
    from emulator.errors import EmulatorError  # noqa: PLC0415

    try:
        sdk_root: Path | None = find_components().sdk_root
    except EmulatorError:
        sdk_root = None  # the Docker backend
    with start_emulators(project=project) as emu:
        emu.export_env()
        yield emu, sdk_root
