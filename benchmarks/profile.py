"""py-spy profiles of the consumers: recorded in a run, summarised afterwards.

``python -m benchmarks.run --py-spy DIR`` records (:func:`record`) two raw
(collapsed-stack) profiles of each measured consumer's backlog phase:
``*-cpu.txt`` (only samples holding the GIL: where the Python CPU goes) and
``*-wall.txt`` (every thread, idle ones too: where a callback thread's time
goes). ``python -m benchmarks.profile DIR [PATTERN] [--under FUNCTION]``
prints, per profile:

- by component (the package of the innermost frame): the share of samples;
- the functions with the most self time, and with the most inclusive time;
- with ``--under``, the samples under a function split by what it called;
- for wall profiles, the callback threads only (``bench_*``,
  ``ThreadPoolExecutor-ThreadScheduler*``, ``pubsub-worker_*``).

Time in C threads that never take the GIL (gRPC's pollers) is not sampled:
compare the samples with the consumer's CPU time in the benchmark's report.
"""

from __future__ import annotations

import argparse
import gzip
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "CALLBACK_THREADS",
    "Profile",
    "component",
    "function",
    "load",
    "main",
    "record",
    "sampling",
    "stop",
]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")
CALLBACK_THREADS = ("bench_", "ThreadPoolExecutor-ThreadScheduler", "pubsub-worker_")
_COMPONENTS = (
    ("pubsub_worker/stores", "pubsub_worker stores"),
    ("pubsub_worker", "pubsub_worker"),
    ("google/cloud/pubsub_v1", "pubsub client"),
    ("google/pubsub_v1", "pubsub client"),
    ("google/cloud/firestore", "firestore client"),
    ("google/api_core", "api_core"),
    ("grpc", "grpc"),
    ("proto/", "proto-plus"),
    ("google/protobuf", "protobuf"),
    ("opentelemetry", "opentelemetry"),
    ("benchmarks", "benchmark harness"),
    ("logging", "logging"),
    ("threading.py", "threading"),
    ("concurrent/futures", "concurrent.futures"),
    ("queue.py", "queue"),
)


def record(exe: str, pids: Mapping[str, int], folder: Path) -> list[subprocess.Popen[bytes]]:
    """Start two py-spy recorders per process (``name -> pid``): CPU (``--gil``) and wall.

    100 samples a second, without pausing the process (``--nonblocking``):
    the sampling still perturbs the numbers, a diagnostic, not a measurement.
    Unpaused, py-spy drops a sample whose stack changed while it read it; what
    it says as it stops (how many it kept and dropped) goes to ``*-cpu.sampling``
    and ``*-wall.sampling`` beside the profiles (:func:`sampling` reads it).
    """
    folder.mkdir(parents=True, exist_ok=True)
    spies = []
    for name, pid in pids.items():
        for mode, flags in (("cpu", ("--gil",)), ("wall", ("--idle", "--threads"))):
            out = folder / f"{name}-{mode}.txt"
            with (folder / f"{name}-{mode}.sampling").open("wb") as said:
                spies.append(
                    subprocess.Popen(
                        [
                            *(exe, "record", "--pid", str(pid), "--rate", "100", "--nonblocking"),
                            *(*flags, "--format", "raw", "--output", str(out)),
                        ],
                        stdout=said,
                        stderr=subprocess.STDOUT,
                    )
                )
    time.sleep(1.0)  # attached before the measurement starts
    return spies


_SAMPLING = re.compile(r"Samples: (?P<kept>\d+) Errors: (?P<dropped>\d+)")


def sampling(log: Path) -> tuple[int, int] | None:
    """The samples py-spy kept and dropped, from what it said as it stopped (``*-cpu.sampling``);
    None if it said nothing of them."""
    if not log.exists():
        return None
    found = _SAMPLING.search(log.read_text(errors="replace"))
    return None if found is None else (int(found["kept"]), int(found["dropped"]))


def stop(spies: Sequence[subprocess.Popen[bytes]]) -> None:
    """Stop the recorders (SIGINT makes py-spy write its file) and wait for them, bounded."""
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def component(frame: str) -> str:
    """The package a frame belongs to, coarsely (``grpc``, ``pubsub_worker`` ...)."""
    match = _FRAME.match(frame)
    path = match.group("file") if match else frame
    for prefix, name in _COMPONENTS:
        if prefix in path:
            return name
    return "other (stdlib, ...)"


def function(frame: str) -> str:
    """``Job.step (pubsub_worker/job.py)``: a frame without its line number."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    return f"{match.group('func')} ({match.group('file')})"


class Profile:
    """One raw py-spy profile: stacks (outermost first) with their sample counts."""

    def __init__(self, path: Path, stacks: Sequence[tuple[str, tuple[str, ...], int]]) -> None:
        self.path = path
        self.stacks = stacks  # (thread name, frames, samples)

    @property
    def samples(self) -> int:
        return sum(count for _, _, count in self.stacks)

    def only_threads(self, prefixes: Sequence[str]) -> Profile:
        """The stacks of threads whose names start with one of ``prefixes``."""
        kept = [s for s in self.stacks if s[0].startswith(tuple(prefixes))]
        return Profile(self.path, kept)

    def by_component(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for _, frames, count in self.stacks:
            out[component(frames[-1]) if frames else "?"] += count
        return out

    def self_time(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for _, frames, count in self.stacks:
            if frames:
                out[function(frames[-1])] += count
        return out

    def children(self, parent: str) -> Counter[str]:
        """Samples under ``parent`` (a function name), split by the function it called."""
        out: Counter[str] = Counter()
        for _, frames, count in self.stacks:
            names = [function(f) for f in frames]
            at = next((i for i, n in enumerate(names) if n.startswith(parent)), None)
            if at is not None:
                out[names[at + 1] if at + 1 < len(names) else "(self)"] += count
        return out

    def inclusive(self, within: str | None = None) -> Counter[str]:
        """Samples in which each function appears (once per stack); ``within``: a path part."""
        out: Counter[str] = Counter()
        for _, frames, count in self.stacks:
            for name in {function(f) for f in frames}:
                if within is None or within in name:
                    out[name] += count
        return out


def load(path: Path) -> Profile:
    """Read a raw profile (``frame;frame;... count``, a ``thread (id): name`` frame first).

    A ``.gz`` file is read decompressed (profiles published with a report are).
    """
    stacks = []
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        frames = head.split(";")
        thread = ""
        if frames and frames[0].startswith("thread ("):
            thread = frames[0].split(": ", 1)[-1]
            frames = frames[1:]
        stacks.append((thread, tuple(frames), int(count)))
    return Profile(path, stacks)


def _table(title: str, counts: Counter[str], total: int, top: int) -> Iterable[str]:
    yield f"  {title}"
    for name, count in counts.most_common(top):
        yield f"    {count * 100 / max(total, 1):5.1f}%  {name}"


def summarise(profile: Profile, top: int, under: Sequence[str] = ()) -> list[str]:
    """The text summary of one profile; ``under``: functions to split by callee."""
    lines = [f"{profile.path.name}: {profile.samples} samples"]
    wall = "-wall.txt" in profile.path.name
    focus = profile.only_threads(CALLBACK_THREADS) if wall else profile
    total = focus.samples
    if wall:
        lines.append(f"  callback threads only: {total} samples")
    lines += _table("by component (innermost frame)", focus.by_component(), total, 12)
    lines += _table("self time", focus.self_time(), total, top)
    lines += _table(
        "inclusive, pubsub_worker functions", focus.inclusive("pubsub_worker"), total, top
    )
    for parent in under:
        lines += _table(f"under {parent}, by callee", focus.children(parent), total, top)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Print the summary of every profile in DIR whose name contains PATTERN."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("folder", type=Path)
    parser.add_argument("pattern", nargs="?", default="", help="part of the file names")
    parser.add_argument("--top", type=int, default=15, help="functions per table (15)")
    parser.add_argument(
        "--under",
        action="append",
        default=[],
        metavar="FUNCTION",
        help="also split the samples under FUNCTION (e.g. 'ExactlyOnce.__call__') by callee",
    )
    args = parser.parse_args(argv)
    paths = sorted(
        p
        for p in (*args.folder.glob("*.txt"), *args.folder.glob("*.txt.gz"))
        if args.pattern in p.name
    )
    if not paths:
        print(f"no profiles matching {args.pattern!r} in {args.folder}", file=sys.stderr)
        return 1
    for path in paths:
        print("\n".join(summarise(load(path), args.top, args.under)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
