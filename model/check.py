"""Check the protocol's Promela model (``model/protocol.pml``) with SPIN.

``python model/check.py`` builds SPIN's verifier of the model (``spin -a``, then
``gcc``), checks every property exhaustively and prints one row per property:
its verdict, the states stored, the depth reached, the search's time and memory.
``--mutants`` then checks every named mutant of the protocol (or the ones named
after it) and prints, for each one refuted, the short trail of its counterexample.

The safety properties are assertions; assertions do not change the state space,
so they share one search (``gcc -DSAFETY``). A property found violated is named
from its trail and the search is repeated without it, so each property still
gets its own verdict. The liveness property is an ``ltl`` formula, checked for
acceptance cycles (``./pan -a``; ``--fair`` adds weak fairness, ``-f``).

Exit status: 0 when every property holds and every mutant checked is refuted;
1 when a property fails on the model (or a search could not finish), or a mutant
is not refuted; 2 when ``spin`` or ``gcc`` is missing. docs/protocol.md states
the properties, maps the model to the code and shows a trail.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MUTANTS",
    "PROPERTIES",
    "Mutant",
    "PanResult",
    "Property",
    "failed_assertion",
    "main",
    "parse_pan",
    "property_at",
    "trail_story",
]

MODEL = Path(__file__).resolve().with_name("protocol.pml")
DEFAULT_FAULTS = 2
"""Faults per run (``MAXF``): crashes, lapsed deadlines and leases, lost answers, failures."""
MEMORY_LIMIT_MB = 2048
"""A search stops (incomplete, a failure) rather than take more memory than this."""
MAX_DEPTH = 100_000
HASH_BITS = 23
TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Property:
    """A property of the model: an assertion macro (safety) or an ``ltl`` formula."""

    name: str
    macro: str
    """``CHECK_X`` enables a safety property's assertions; a liveness one names its ``ltl``."""
    liveness: bool
    sentence: str


PROPERTIES: tuple[Property, ...] = (
    Property(
        "one-completion",
        "CHECK_ONE_COMPLETION",
        False,
        "A job is completed at most once.",
    ),
    Property(
        "fenced",
        "CHECK_FENCED",
        False,
        "A write of an owner lands only while its claim is the job's current one: "
        "no write from a stale epoch lands.",
    ),
    Property(
        "steps",
        "CHECK_STEPS",
        False,
        "A step's record is written once and never overwritten; the current owner never runs "
        "a recorded step; a step runs only after its predecessor's record is durable.",
    ),
    Property(
        "ack-after-durable",
        "CHECK_ACK_AFTER_DURABLE",
        False,
        "A message is acked only after its job was completed or failed durably.",
    ),
    Property(
        "outbox",
        "CHECK_OUTBOX",
        False,
        "An outbox entry is published only once committed, marked sent only once published, "
        "and a job completes only with every committed entry marked sent.",
    ),
    Property(
        "failed-xor-completed",
        "CHECK_FAILED_XOR_COMPLETED",
        False,
        "A completion and a failed record land only over a running claim: a job in the "
        "failure path is never also completed.",
    ),
    Property(
        "release-aimed",
        "CHECK_RELEASE_AIMED",
        False,
        "`jobs release --expect-epoch E` never releases a claim made after epoch E was shown.",
    ),
    Property(
        "review-only-failed",
        "CHECK_REVIEW_ONLY_FAILED",
        False,
        "A failure message goes out only while its job's failed record is durable (or after "
        "a replay revived that failed job): a job whose failure message went out is never "
        "completed unless replayed.",
    ),
    Property(
        "settles",
        "settles",
        True,
        "Once the faults are over, the job ends completed or failed, a failed job's failure "
        "message is out, and every message is acked.",
    ),
)


@dataclass(frozen=True)
class Mutant:
    """A named variant of the protocol, selected by a ``#define``: SPIN must refute it."""

    name: str
    macro: str
    what: str


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "commit-unconditioned",
        "MUTANT_COMMIT_UNCONDITIONED",
        "the owner's writes land without the version condition",
    ),
    Mutant(
        "ack-before-durable",
        "MUTANT_ACK_BEFORE_DURABLE",
        "the ack is sent before the completion is written",
    ),
    Mutant(
        "claim-no-epoch-bump",
        "MUTANT_CLAIM_NO_EPOCH_BUMP",
        "a claim keeps the epoch it read",
    ),
    Mutant(
        "renew-without-ownership",
        "MUTANT_RENEW_WITHOUT_OWNERSHIP",
        "the lease renewal writes without the ownership checks",
    ),
    Mutant(
        "complete-with-unsent",
        "MUTANT_COMPLETE_WITH_UNSENT",
        "the completion does not publish unsent outbox entries first",
    ),
    Mutant(
        "review-before-record",
        "MUTANT_REVIEW_BEFORE_RECORD",
        "the failure message is published before the failed record is written",
    ),
)


# -- pan's output ---------------------------------------------------------------------


@dataclass(frozen=True)
class PanResult:
    """What one run of SPIN's verifier (``pan``) reported."""

    errors: int
    violation: str
    """pan's line for the first error (an assertion, an acceptance cycle, an invalid end
    state), empty when there is none."""
    stored: int
    transitions: int
    depth: int
    seconds: float
    memory_mb: float
    complete: bool
    """The search covered the whole state space (no depth or memory limit was hit)."""

    @property
    def holds(self) -> bool:
        """No error, and nothing left unexplored."""
        return self.errors == 0 and self.complete


_INCOMPLETE = (
    "max search depth too small",
    "reached -DMEMLIM bound",
    "out of memory",
    "Search not completed",
)


def _number(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


def parse_pan(output: str) -> PanResult:
    """The verdict and the numbers of a ``pan`` run's output. Pure.

    Raises :class:`ValueError` when the output has no search summary (pan did not run).
    """
    errors = _number(r"errors:\s*(\d+)", output)
    stored = _number(r"^\s*([\d.e+]+) states, stored", output)
    if errors is None or stored is None:
        raise ValueError("not the output of a finished pan run:\n" + output[-2000:])
    violation = ""
    for line in output.splitlines():
        if re.match(r"pan:\d+: ", line):
            violation = re.sub(r"^pan:\d+: ", "", line).strip()
            break
    incomplete = any(marker in output for marker in _INCOMPLETE)
    return PanResult(
        errors=int(errors),
        violation=violation,
        stored=int(stored),
        transitions=int(_number(r"^\s*([\d.e+]+) transitions", output) or 0),
        depth=int(_number(r"depth reached (\d+)", output) or 0),
        seconds=_number(r"elapsed time ([\d.e+]+) seconds", output) or 0.0,
        memory_mb=_number(r"^\s*([\d.]+)\s+total actual memory usage", output) or 0.0,
        complete=errors > 0 or not incomplete,
    )


# -- trails ---------------------------------------------------------------------------


def _assertion_macro(prop: Property) -> str:
    """``CHECK_ONE_COMPLETION`` guards the assertions written ``one_completion(...)``."""
    return prop.macro.removeprefix("CHECK_").lower()


_ASSERTION = re.compile(
    r"\b(" + "|".join(_assertion_macro(p) for p in PROPERTIES if not p.liveness) + r")\("
)


def property_at(model_text: str, line: int) -> str | None:
    """The property whose assertion is on ``line`` (1-based) of the model, if any. Pure."""
    lines = model_text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    match = _ASSERTION.search(lines[line - 1])
    return match.group(1).replace("_", "-") if match else None


def trail_story(replay: str) -> tuple[list[str], int | None]:
    """The narration of a replayed trail (``spin -t``), and the line of its failed assertion.

    Keeps the model's narration (lines starting with ``@``) and marks where an
    acceptance cycle starts. Pure.
    """
    story: list[str] = []
    failed_line: int | None = None
    for raw in replay.splitlines():
        line = raw.strip()
        if line.startswith("@ "):
            story.append(line[2:])
        elif "START OF CYCLE" in line:
            story.append("from here on, the run repeats forever:")
        elif match := re.match(r"spin: \S+:(\d+), Error: assertion violated", line):
            failed_line = int(match.group(1))
    return story, failed_line


def failed_assertion(model_text: str, line: int) -> str:
    """How a trail ends: the assertion that fails, as written on ``line`` of the model. Pure."""
    lines = model_text.splitlines()
    source = lines[line - 1].strip() if 1 <= line <= len(lines) else "?"
    return f"fails: {source} (model/protocol.pml:{line})"


# -- running SPIN ---------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One verifier run and what it found."""

    label: str
    result: PanResult
    story: list[str]
    failed: str | None
    """The property whose assertion failed (from the trail), or the liveness property."""
    total_s: float


def _run(command: Sequence[str], cwd: Path) -> str:
    done = subprocess.run(
        list(command), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if done.returncode != 0 and command[0] != "./pan":
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


@dataclass(frozen=True)
class Search:
    """How to build and run one verifier: model defines, and safety or liveness."""

    defines: tuple[str, ...]
    liveness: bool
    fair: bool = False
    shortest: bool = False
    """Breadth-first (the shortest counterexample), for mutants."""

    def spin_flags(self) -> list[str]:
        flags = [f"-D{name}" for name in self.defines]
        return [*flags, "-DBFS_TRAILS"] if self.shortest else flags

    def gcc_flags(self) -> list[str]:
        flags = ["-O0", f"-DMEMLIM={MEMORY_LIMIT_MB}"]
        if self.liveness:
            return [*flags, "-DNFAIR=3"] if self.fair else flags
        return [*flags, "-DSAFETY", "-DNOCLAIM", *(["-DBFS"] if self.shortest else [])]

    def pan_flags(self) -> list[str]:
        flags = ["-n", f"-m{MAX_DEPTH}", f"-w{HASH_BITS}"]
        if self.liveness:
            return [*flags, "-a", *(["-f"] if self.fair else [])]
        return flags


def run_search(search: Search, workdir: Path, label: str) -> Check:
    """Run ``search``; a safety violation is then searched again breadth-first for its trail.

    The numbers are the depth-first search's (up to its first counterexample); the trail
    and the property it refutes are the breadth-first search's: the shortest there is.
    (Breadth-first, pan also stores the states inside atomic sequences, so it is kept
    for the short searches that find a counterexample.)
    """
    check = _search(search, workdir, label)
    if not check.result.errors or search.liveness or search.shortest:
        return check
    shortest = _search(dataclasses.replace(search, shortest=True), workdir, label)
    if not shortest.result.errors:
        return check
    total_s = check.total_s + shortest.total_s
    return Check(label, check.result, shortest.story, shortest.failed, total_s)


def _search(search: Search, workdir: Path, label: str) -> Check:
    """Build the verifier in ``workdir``, run it, and replay its trail if it found an error."""
    started = time.monotonic()
    for stale in workdir.glob("pan*"):
        stale.unlink()
    for stale in workdir.glob("*.trail"):
        stale.unlink()
    shutil.copyfile(MODEL, workdir / MODEL.name)
    _run(["spin", "-a", *search.spin_flags(), MODEL.name], workdir)
    _run(["gcc", *search.gcc_flags(), "-o", "pan", "pan.c"], workdir)
    result = parse_pan(_run(["./pan", *search.pan_flags()], workdir))
    story: list[str] = []
    failed: str | None = None
    if result.errors:
        replay = _run(["spin", "-t", *search.spin_flags(), MODEL.name], workdir)
        story, line = trail_story(replay)
        if search.liveness:
            failed = "settles"
        elif line is not None:
            model_text = MODEL.read_text(encoding="utf-8")
            failed = property_at(model_text, line)
            story.append(failed_assertion(model_text, line))
    return Check(label, result, story, failed, time.monotonic() - started)


# -- checking the model and the mutants -----------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A property's verdict on the model, with the run it came from."""

    prop: Property
    check: Check
    holds: bool


def check_safety(props: Sequence[Property], faults: int, workdir: Path) -> list[Verdict]:
    """One search for all ``props``; each violated one is named, and the rest searched again."""
    verdicts: list[Verdict] = []
    left = list(props)
    while left:
        defines = (f"MAXF={faults}", *(p.macro for p in left))
        label = "safety: " + ", ".join(p.name for p in left)
        check = run_search(Search(defines, liveness=False), workdir, label)
        culprit = next((p for p in left if p.name == check.failed), None)
        if check.result.holds or culprit is None:
            verdicts += [Verdict(p, check, check.result.holds) for p in left]
            break
        verdicts.append(Verdict(culprit, check, False))
        left.remove(culprit)
    return verdicts


def check_model(props: Sequence[Property], faults: int, fair: bool, workdir: Path) -> list[Verdict]:
    """Every property of ``props`` on the model."""
    safety = [p for p in props if not p.liveness]
    verdicts = check_safety(safety, faults, workdir) if safety else []
    for prop in (p for p in props if p.liveness):
        search = Search((f"MAXF={faults}",), liveness=True, fair=fair)
        check = run_search(search, workdir, f"liveness: {prop.name}")
        verdicts.append(Verdict(prop, check, check.result.holds))
    return verdicts


def check_mutant(mutant: Mutant, faults: int, workdir: Path) -> Check:
    """The mutant against every safety property, then the liveness one."""
    safety = tuple(p.macro for p in PROPERTIES if not p.liveness)
    defines = (f"MAXF={faults}", mutant.macro, *safety)
    check = run_search(Search(defines, liveness=False), workdir, mutant.name)
    if check.result.errors:
        return check
    search = Search((f"MAXF={faults}", mutant.macro), liveness=True)
    return run_search(search, workdir, mutant.name)


# -- output ---------------------------------------------------------------------------


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    lines = [_row(header, widths), _row(["-" * w for w in widths], widths)]
    return "\n".join([*lines, *(_row(row, widths) for row in rows)])


def _numbers(result: PanResult) -> list[str]:
    return [
        f"{result.stored:,}",
        f"{result.transitions:,}",
        str(result.depth),
        f"{result.seconds:.1f}",
        f"{result.memory_mb:.0f}",
    ]


_NUMBERS = ["states", "transitions", "depth", "search s", "memory MB"]


def _verdict_text(verdict: Verdict) -> str:
    if verdict.holds:
        return "holds"
    if verdict.check.result.errors:
        return "VIOLATED"
    return "INCOMPLETE"


def print_model(verdicts: Sequence[Verdict], faults: int) -> None:
    print(f"model/protocol.pml: 1 job, 2 messages, 2 workers, at most {faults} faults per run")
    rows = [
        [
            v.prop.name,
            "liveness" if v.prop.liveness else "safety",
            _verdict_text(v),
            *_numbers(v.check.result),
        ]
        for v in verdicts
    ]
    print(_table(["property", "kind", "verdict", *_NUMBERS], rows))
    runs = {id(v.check): v.check for v in verdicts}
    total = sum(check.total_s for check in runs.values())
    print(f"{len(runs)} verifier run(s), {total:.1f} s with building")
    for verdict in verdicts:
        if not verdict.holds:
            _print_story(f"{verdict.prop.name}: {verdict.prop.sentence}", verdict.check)


def print_mutants(checks: Sequence[tuple[Mutant, Check]]) -> None:
    rows = [
        [
            mutant.name,
            f"refuted by {check.failed}" if check.result.errors else "NOT REFUTED",
            *_numbers(check.result),
        ]
        for mutant, check in checks
    ]
    print()
    print(_table(["mutant", "verdict", *_NUMBERS], rows))
    for mutant, check in checks:
        if check.result.errors:
            _print_story(f"{mutant.name} ({mutant.what}), refuted by {check.failed}", check)


def _print_story(title: str, check: Check) -> None:
    print(f"\n{title}")
    if check.result.violation and not check.result.violation.startswith("assertion"):
        print(f"  pan: {check.result.violation}")
    for number, line in enumerate(check.story, start=1):
        print(f"  {number:2}. {line}")


# -- command line ---------------------------------------------------------------------


def missing_tools() -> list[str]:
    """The tools this driver needs and cannot find."""
    return [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]


def _parser() -> argparse.ArgumentParser:
    names = [p.name for p in PROPERTIES]
    parser = argparse.ArgumentParser(
        prog="python model/check.py",
        description="Check the protocol's Promela model with SPIN (docs/protocol.md).",
    )
    parser.add_argument(
        "--mutants",
        nargs="*",
        metavar="NAME",
        choices=[m.name for m in MUTANTS],
        help="after the model, check that these mutants (all when none is named) are refuted",
    )
    parser.add_argument(
        "--property",
        action="append",
        choices=names,
        dest="properties",
        metavar="NAME",
        help=f"check only this property (repeatable): {', '.join(names)}",
    )
    parser.add_argument(
        "--faults",
        type=int,
        default=DEFAULT_FAULTS,
        help=f"faults per run, at most (default {DEFAULT_FAULTS})",
    )
    parser.add_argument(
        "--fair", action="store_true", help="check liveness under weak fairness (pan -f)"
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="build in DIR and keep it (default: a temp dir)"
    )
    return parser


@contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="pubsub-worker-model-") as name:
        yield Path(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Check the model (and the mutants); the exit status of the module docstring."""
    args = _parser().parse_args(argv)
    if missing := missing_tools():
        print(
            f"{' and '.join(missing)} not found: install Debian's spin and gcc "
            "(apt-get install spin gcc)",
            file=sys.stderr,
        )
        return 2
    wanted = args.properties or [p.name for p in PROPERTIES]
    props = [p for p in PROPERTIES if p.name in wanted]
    with _workdir(args.keep) as workdir:
        verdicts = check_model(props, args.faults, args.fair, workdir)
        print_model(verdicts, args.faults)
        failed = not all(v.holds for v in verdicts)
        if args.mutants is not None:
            chosen = [m for m in MUTANTS if not args.mutants or m.name in args.mutants]
            checks = [(mutant, check_mutant(mutant, args.faults, workdir)) for mutant in chosen]
            print_mutants(checks)
            failed = failed or not all(check.result.errors for _, check in checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
