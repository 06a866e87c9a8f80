"""What a consumer's profiles say, in the report's terms: where its GIL time and its threads go.

A benchmark session ends with a profile round (:mod:`benchmarks.run`): one
more run of each of :data:`PROFILED`, with py-spy attached, not counted in
the figures. :func:`breakdown` turns its two profiles into the figures the
report prints and the targets quote:

- CPU (``*-cpu.txt``, only samples that hold the GIL): milliseconds of GIL
  per message, split by :data:`CPU_PARTS`. py-spy samples 100 times a
  second, so a sample is 10 ms of one thread holding the GIL; time in C
  threads that never take it (gRPC's pollers) is not in it.
- wall (``*-wall.txt``, every thread): the share of the callback threads'
  time in each of :data:`WALL_PARTS`.

A stack goes to the first part whose test it passes, in the order listed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.profile import CALLBACK_THREADS, Profile, function, load, sampling

__all__ = [
    "CPU_PARTS",
    "PROFILED",
    "SAMPLE_MS",
    "WALL_PARTS",
    "Part",
    "breakdown",
    "classify",
    "profile_tables",
]

PROFILED = (
    "stock-eod",
    "wrapped-1",
    "wrapped-3",
    "stock-eod-default",
    "wrapped-1-default",
    "stock-eod-c100",
    "wrapped-1-c100",
    "wrapped-1-memory",
)
"""The scenarios of the profile round: the stock client and the wrapper, where the targets are."""

SAMPLE_MS = 10.0
"""py-spy records 100 samples a second."""

Stack = Sequence[str]
"""Function names, outermost first (``Job.step (pubsub_worker/job.py)``)."""


def _has(*names: str) -> Callable[[Stack], bool]:
    return lambda stack: any(frame.startswith(names) for frame in stack)


def _in_file(part: str) -> Callable[[Stack], bool]:
    return lambda stack: any(part in frame for frame in stack)


_CALLBACK = _has("ExactlyOnce.__call__", "_wrap_callback_errors")
_WRAPPER = _has("ExactlyOnce.__call__", "DeliveryFlow._conclude_guarded")  # or its completer
_WRITES = _has(
    "WriteBatcher.submit",
    "create_write",
    "update_write",
    "BatchingFirestoreJobStore.",
    "FirestoreJobStore._settled",
)


def _handler_or_ack(stack: Stack) -> bool:
    """The handler's own work, its steps, the ack; for the stock callback, all of it."""
    if _WRAPPER(stack):
        return _has("Job.step", "Message.ack")(stack) or _in_file("benchmarks/handlers")(stack)
    return _CALLBACK(stack)


Part = tuple[str, str, Callable[[Stack], bool]]
"""A key, what it is, and the test of a stack."""

CPU_PARTS: tuple[Part, ...] = (
    (
        "send",
        "sending write batches (the gRPC call, settling each write)",
        _has("WriteBatcher._send"),
    ),
    ("writes", "building, queueing and awaiting each write", _WRITES),
    (
        "handler",
        "the handler, its steps and the ack (the stock callback: all of it)",
        _handler_or_ack,
    ),
    (
        "bookkeeping",
        "the wrapper's bookkeeping (tracker, gate, identity, job, outcome, logs)",
        _WRAPPER,
    ),
    ("harness", "the benchmark's harness (recording each message)", _in_file("benchmarks/")),
    ("client", "the Pub/Sub client's own threads (stream, dispatcher, leases)", lambda s: True),
)
"""Where the GIL time of a consumer goes."""

WALL_PARTS: tuple[Part, ...] = (
    ("idle", "waiting for a message", lambda s: not _CALLBACK(s)),
    ("claim", "the claim's write", _has("claim (pubsub_worker/_job/claim.py", "claim_job (")),
    (
        "complete",
        "the completion's write",
        _has("JobCore.complete", "FencedDocument.complete"),
    ),
    ("steps", "the steps (each step's record written before the next)", _has("Job.step")),
    ("ack", "awaiting the ack's answer", _has("Future.result")),
    ("other", "other work", lambda s: True),
)
"""Where a callback thread's time goes."""


def classify(stack: Stack, parts: Sequence[Part]) -> str:
    """The key of the first part whose test ``stack`` passes."""
    return next(key for key, _, test in parts if test(stack))


def _shares(profile: Profile, parts: Sequence[Part]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _, frames, samples in profile.stacks:
        counts[classify([function(f) for f in frames], parts)] += samples
    return counts


def _found(folder: Path, stem: str) -> Path | None:
    """``stem.txt`` (a raw profile) or ``stem.txt.gz`` (as published), if either exists."""
    for path in (folder / f"{stem}.txt", folder / f"{stem}.txt.gz"):
        if path.exists():
            return path
    return None


def breakdown(folder: Path, label: str, messages: int) -> dict[str, Any] | None:
    """The figures of one profiled consumer (``label``: ``profile-wrapped-1-p0``, or a published
    profile's ``wrapped-1``); None if absent.

    ``cpu``: GIL ms per message by part (and ``total``); ``wall``: the callback
    threads' share of time by part; ``samples``: how many each profile holds;
    ``dropped``: how many py-spy dropped while recording each (None: unknown).
    """
    cpu_path, wall_path = _found(folder, f"{label}-cpu"), _found(folder, f"{label}-wall")
    if cpu_path is None or wall_path is None or messages <= 0:
        return None
    cpu, wall = load(cpu_path), load(wall_path).only_threads(CALLBACK_THREADS)
    cpu_counts, wall_counts = _shares(cpu, CPU_PARTS), _shares(wall, WALL_PARTS)
    wall_total = max(wall.samples, 1)
    return {
        "samples": {"cpu": cpu.samples, "wall": wall.samples},
        "dropped": {
            mode: _dropped(folder / f"{label}-{mode}.sampling") for mode in ("cpu", "wall")
        },
        "cpu": {
            **{key: cpu_counts[key] * SAMPLE_MS / messages for key, _, _ in CPU_PARTS},
            "total": cpu.samples * SAMPLE_MS / messages,
        },
        "wall": {key: wall_counts[key] / wall_total for key, _, _ in WALL_PARTS},
    }


def _dropped(log: Path) -> int | None:
    said = sampling(log)
    return None if said is None else said[1]


def _with_dropped(found: dict[str, Any], run: dict[str, Any]) -> str:
    dropped = found.get("dropped", {}).get("cpu")
    if dropped is None:
        return "?"
    samples = found["samples"]["cpu"] + dropped
    return f"{samples * SAMPLE_MS / max(run['phases']['backlog']['messages'], 1):.2f}"


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _consumer_cpu_ms(run: dict[str, Any]) -> float:
    phase = run["phases"]["backlog"]
    return float(sum(phase["consumer_cpu_s"]) * 1000 / phase["messages"])


def profile_tables(report: dict[str, Any]) -> list[str]:
    """The profile round: GIL time per message by part, callback threads' time by part."""
    profiled = {
        name: run
        for name, run in report.get("profiled", {}).items()
        if run.get("breakdown") is not None
    }
    if not profiled:
        return []
    names = list(profiled)
    head = "| | " + " | ".join(f"`{n}`" for n in names) + " |"
    rule = "| --- |" + " ---: |" * len(names)
    found = {n: profiled[n]["breakdown"] for n in names}
    lines = [
        "One more run of each scenario below, after the repeats, with py-spy attached "
        "(100 samples a second, not counted in the figures above; the sampling slows the "
        "consumer a little). Raw profiles: `docs/profiles/` (`python -m benchmarks.profile "
        "docs/profiles wrapped-1-cpu`). GIL: only samples that hold it, 10 ms each, per "
        "message; gRPC's C threads that never take it are in the consumer's CPU, not here. "
        "py-spy does not pause the consumer and drops a sample whose stack changed while it "
        "read it, more of the wrapper's than of the stock client's (the row of samples says "
        "how many): the parts, of the samples kept, undercount the wrapper against the stock "
        "client, and the GIL counted with the dropped samples comes near the consumer's CPU, "
        "the measured figure.",
        "",
        "GIL held, ms per message (CPU profile):",
        "",
        head,
        rule,
    ]
    for key, text, _ in CPU_PARTS:
        lines.append(
            f"| {text} | " + " | ".join(f"{found[n]['cpu'][key]:.2f}" for n in names) + " |"
        )
    lines.append(
        "| **GIL in all** | "
        + " | ".join(f"**{found[n]['cpu']['total']:.2f}**" for n in names)
        + " |"
    )
    lines.append(
        "| GIL in all, dropped samples included | "
        + " | ".join(_with_dropped(found[n], profiled[n]) for n in names)
        + " |"
    )
    lines.append(
        "| consumer CPU in this run (all threads) | "
        + " | ".join(f"{_consumer_cpu_ms(profiled[n]):.2f}" for n in names)
        + " |"
    )
    lines.append(
        "| samples holding the GIL (dropped), messages | "
        + " | ".join(
            f"{found[n]['samples']['cpu']:,} ({_count(found[n].get('dropped', {}).get('cpu'))}),"
            f" {profiled[n]['phases']['backlog']['messages']:,}"
            for n in names
        )
        + " |"
    )
    lines.append(
        "| msg/s in this run | "
        + " | ".join(f"{profiled[n]['phases']['backlog']['msgs_per_s']:,.0f}" for n in names)
        + " |"
    )
    lines += ["", "Callback threads' time (wall profile):", "", head, rule]
    for key, text, _ in WALL_PARTS:
        lines.append(
            f"| {text} | " + " | ".join(f"{found[n]['wall'][key] * 100:.1f}%" for n in names) + " |"
        )
    return lines
