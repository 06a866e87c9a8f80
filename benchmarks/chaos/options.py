"""The command line of the chaos run, and what it resolves to."""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.schedule import DEFAULT_RATES, SHORT_RATES, Fault, parse_rates

__all__ = ["CI_SEED", "Options", "parse_args"]

CI_SEED = 1713
"""The fixed seed of the short run in CI (a random one runs beside it)."""

_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Options:
    """What one chaos run does (one seed; :func:`parse_args` returns one per seed).

    Durations are seconds unless the name says otherwise.
    """

    seed: int
    workers: int = 4
    jobs: int = 2000
    rates: Mapping[Fault, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    max_impaired: int = 2
    """Workers down, paused or partitioned at once, at most."""
    error_ratio: float = 0.3
    """Fraction of acks (or modacks) that fail while an error window is open."""
    lease_s: int = 10
    max_messages: int = 8
    """Jobs in flight per worker (``PUBSUB_WORKER_MAX_MESSAGES``)."""
    prepare_ms: tuple[int, int] = (300, 1000)
    emit_ms: tuple[int, int] = (50, 250)
    publish_rate: float = 14.0
    """Jobs published per second (0: all at once)."""
    poison_ratio: float = 0.01
    """Fraction of jobs that raise ``PermanentError``: they must end in the failure path."""
    time_limit_s: float = 900.0
    """Bound on the whole run after the emulators are up; faults stop earlier (see run)."""
    fault_time_s: float | None = None
    """Faults stop this long after the first delivery at the latest (None: while work remains)."""
    store: str = "batching"
    unfenced: bool = False
    """Switch the version precondition of step commits off: the run must then fail."""
    baseline: tuple[str, ...] = ()
    """Baseline variants (``before``, ``after``) run after the library on the same seed."""
    handler: str = "library"
    """What the fleet runs: ``library``, or the baseline variant ``before`` or ``after``."""
    json_path: Path | None = None
    log_dir: Path | None = None
    command: str = ""
    parallel: bool = False
    """Run the seeds of the command line, and the library's and baseline's runs of a seed,
    at the same time (on the same emulators)."""
    live: bool = False
    """Rewrite one progress line in place (a terminal) instead of printing lines."""

    def as_json(self) -> dict[str, Any]:
        """The options as JSON values (for the report)."""
        data = dataclasses.asdict(self)
        data["rates"] = {fault.value: rate for fault, rate in self.rates.items()}
        for key in ("json_path", "log_dir"):
            data[key] = str(data[key]) if data[key] is not None else None
        return data

    @property
    def label(self) -> str:
        """``4 workers x 2000 jobs``."""
        return f"{self.workers} workers x {self.jobs} jobs"


def _seeds(raw: str) -> list[int]:
    seeds: list[int] = []
    for part in (piece.strip() for piece in raw.split(",")):
        if part == "random":
            seeds.append(secrets.randbelow(2**31))
        elif part:
            seeds.append(int(part))
    if not seeds:
        raise ValueError("no seed given")
    return seeds


def _range_ms(raw: str) -> tuple[int, int]:
    low, _, high = raw.partition("-")
    values = (int(low), int(high or low))
    if not 0 <= values[0] <= values[1]:
        raise ValueError(f"{raw!r}: expected LOW-HIGH milliseconds")
    return values


def parse_args(argv: Sequence[str] | None = None) -> list[Options]:
    """Read the command line; one :class:`Options` per seed, in order."""
    kinds = ", ".join(fault.value for fault in Fault)
    defaults = ", ".join(f"{fault.value}={rate:g}" for fault, rate in DEFAULT_RATES.items())
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description="A fleet of exactly-once workers on the local emulators under seeded "
        "faults; every effect is counted at the end. Exit 1 if an invariant fails.",
        epilog=f"Fault kinds: {kinds}. Default rates (events per minute): {defaults}.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="the CI run: 400 jobs, 150 s bound, every fault kind at higher rates "
        "(explicit values win)",
    )
    parser.add_argument(
        "--seed",
        default="random",
        help="seed, or comma-separated seeds run one after the other on the same emulators; "
        "'random' draws one and prints it (default: random)",
    )
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--jobs", type=int, help="jobs (default 2000; short 400)")
    parser.add_argument(
        "--rate",
        action="append",
        default=[],
        metavar="KIND=PER_MIN",
        help="events per minute of a fault kind (repeatable)",
    )
    parser.add_argument(
        "--off",
        action="append",
        default=[],
        metavar="KIND",
        help="switch a fault kind off (repeatable; 'all' for every kind, then --rate to pick)",
    )
    parser.add_argument(
        "--max-impaired",
        type=int,
        help="workers down, paused or partitioned at once, at most (default: half the fleet)",
    )
    parser.add_argument(
        "--error-ratio",
        type=float,
        default=0.3,
        help="fraction of acks/modacks failing during an error window (default 0.3)",
    )
    parser.add_argument("--lease", type=int, default=10, help="lease seconds (default 10)")
    parser.add_argument(
        "--max-messages", type=int, default=8, help="jobs in flight per worker (default 8)"
    )
    parser.add_argument(
        "--prepare-ms", default="300-1000", help="duration of the plain step (default 300-1000)"
    )
    parser.add_argument(
        "--emit-ms", default="50-250", help="duration of the output step (default 50-250)"
    )
    parser.add_argument(
        "--publish-rate",
        type=float,
        help="jobs published per second, 0 for all at once (default: about half of what "
        "the fleet can do without faults; short 14, so that work arrives all through the "
        "fault phase)",
    )
    parser.add_argument(
        "--poison",
        type=float,
        default=0.01,
        help="fraction of jobs that can never succeed (default 0.01)",
    )
    parser.add_argument(
        "--time-limit", type=float, help="bound on the run in seconds (default 900; short 150)"
    )
    parser.add_argument(
        "--fault-time",
        type=float,
        help="inject faults for at most this many seconds (default: while work remains; short 30)",
    )
    parser.add_argument(
        "--store",
        choices=("batching", "plain"),
        default="batching",
        help="job store: BatchingFirestoreJobStore (the default store) or FirestoreJobStore",
    )
    parser.add_argument(
        "--unfenced",
        action="store_true",
        help="switch the version precondition of step commits off (a deliberately broken "
        "store): the run must then report doubled effects",
    )
    parser.add_argument(
        "--baseline",
        nargs="?",
        const="both",
        choices=("before", "after", "both"),
        help="after the library, run the same seed and faults against the stock client with "
        "a create-only Firestore marker per message id, written before the work, after it, "
        "or both (the default), and print the counts side by side",
    )
    parser.add_argument(
        "--json",
        default=str(_ROOT / ".nox" / "chaos.json"),
        help="JSON report (default .nox/chaos.json); '-' for none",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run the seeds (and with --baseline, the library's and the baseline's runs of "
        "each seed) at the same time rather than one after the other",
    )
    parser.add_argument("--log-dir", help="keep worker logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        seeds = _seeds(args.seed)
        rates = parse_rates(args.rate, args.off, base=SHORT_RATES if args.short else DEFAULT_RATES)
        prepare_ms, emit_ms = _range_ms(args.prepare_ms), _range_ms(args.emit_ms)
    except ValueError as exc:
        parser.error(str(exc))
    if args.workers < 1 or (args.jobs is not None and args.jobs < 1):
        parser.error("--workers and --jobs must be at least 1")
    if not 0 <= args.error_ratio <= 1 or not 0 <= args.poison < 1:
        parser.error("--error-ratio is 0..1 and --poison 0..<1")
    if args.baseline and args.unfenced:
        parser.error("--baseline compares with the library as it is: not with --unfenced")
    baseline = {None: (), "both": ("before", "after")}.get(args.baseline, (args.baseline,))
    given = list(sys.argv[1:] if argv is None else argv)
    return [
        Options(
            seed=seed,
            workers=args.workers,
            jobs=args.jobs if args.jobs is not None else (400 if args.short else 2000),
            rates=rates,
            max_impaired=args.max_impaired or max(args.workers // 2, 1),
            error_ratio=args.error_ratio,
            lease_s=args.lease,
            max_messages=args.max_messages,
            prepare_ms=prepare_ms,
            emit_ms=emit_ms,
            publish_rate=_publish_rate(args, prepare_ms, emit_ms),
            poison_ratio=args.poison,
            time_limit_s=args.time_limit or (150.0 if args.short else 900.0),
            fault_time_s=args.fault_time or (30.0 if args.short else None),
            store=args.store,
            unfenced=args.unfenced,
            baseline=baseline,
            json_path=None if args.json == "-" else Path(args.json),
            log_dir=Path(args.log_dir) if args.log_dir else None,
            command=_command(given, seed),
            parallel=args.parallel,
            live=sys.stderr.isatty(),
        )
        for seed in seeds
    ]


def _publish_rate(
    args: argparse.Namespace, prepare_ms: tuple[int, int], emit_ms: tuple[int, int]
) -> float:
    if args.publish_rate is not None:
        return float(args.publish_rate)
    if args.short:
        return 14.0
    return _capacity(args.workers, args.max_messages, prepare_ms, emit_ms) * 0.5


def _capacity(
    workers: int, max_messages: int, prepare_ms: tuple[int, int], emit_ms: tuple[int, int]
) -> float:
    """Jobs per second the fleet completes without faults, roughly: the steps' mean
    durations plus about 0.15 s of claims, commits and acks per job."""
    job_s = (sum(prepare_ms) + sum(emit_ms)) / 2000 + 0.15
    return workers * max_messages / job_s


def _command(given: list[str], seed: int) -> str:
    """The command that repeats this run: the arguments given, with this seed only."""
    kept: list[str] = []
    skip = False
    for arg in given:
        if skip:
            skip = False
            continue
        if arg == "--seed":
            skip = True
            continue
        if arg.startswith("--seed="):
            continue
        kept.append(arg)
    return shlex.join(["python", "-m", "benchmarks.chaos", *kept, "--seed", str(seed)])
