"""Check the protocol's Promela model (``model/protocol.pml``) with SPIN.

``python model/check.py`` builds SPIN's verifier of the model (``spin -a``, then
``gcc``), checks every property exhaustively and prints one row per property:
its verdict, the states stored, the depth reached, the search's time and memory.
The same search counts how often each statement of the model ran (pan's peg
counts) and which local states it reached: a branch of the model that no run
takes (a guard that never fires, an ``else`` never taken) is dead model code,
which the check reports as a failure, so a path the code has and the model
cannot reach is found by the check itself. ``--mutants`` then checks every
named mutant of the protocol (or the ones named after it) and prints, for each
one refuted, the short trail of its counterexample; an equivalent mutant (one
the model shows changes nothing) must leave the state space exactly as it is.

The safety properties are assertions; assertions do not change the state space,
so they share one search (``gcc -DSAFETY``). A property found violated is named
from its trail and the search is repeated without it, so each property still
gets its own verdict. The liveness property is an ``ltl`` formula, checked for
acceptance cycles (``./pan -a``; ``--fair`` adds weak fairness, ``-f``).

Exit status: 0 when every property holds, every branch of the model is taken
and every mutant checked is refuted (or, named equivalent, changes nothing); 1
when a property fails on the model (or a search could not finish), a branch is
never taken, or a mutant is not refuted; 2 when ``spin`` or ``gcc`` is missing.
docs/protocol.md states the properties, maps the model to the code and shows a trail.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MUTANTS",
    "PROPERTIES",
    "Dead",
    "Mutant",
    "PanResult",
    "Property",
    "Transition",
    "dead_code",
    "failed_assertion",
    "main",
    "parse_pan",
    "parse_pegs",
    "parse_transitions",
    "parse_unreached",
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
DEFAULT_JOBS = 2
"""Searches run at a time: each verifier is single-threaded, and CI has two cores."""


@dataclass(frozen=True)
class Property:
    """A property of the model: an assertion macro (safety) or an ``ltl`` formula."""

    name: str
    macro: str
    """``CHECK_X`` enables a safety property's assertions; a liveness one names its ``ltl``."""
    liveness: bool
    sentence: str
    implied_by: str = ""
    """A property this one follows from (it is kept as the narrower statement, named so)."""


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
        "one-run-per-process",
        "CHECK_ONE_RUN_PER_PROCESS",
        False,
        "A step function never runs in two deliveries of one process at once (unless one is "
        "past its processing cap: a take-over, as by another process).",
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
        implied_by="fenced",
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
        "Once the faults are over, the job ends completed, or failed with the failure message "
        "of its current era published and marked so, and every message is acked.",
    ),
)


@dataclass(frozen=True)
class Mutant:
    """A named variant of the protocol, selected by a ``#define``: SPIN must refute it."""

    name: str
    macro: str
    what: str
    equivalent: str = ""
    """Why the mutant changes nothing, if it does not: then its search must hold and store
    exactly the model's states and transitions (an equivalence the check keeps true)."""


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
        "renew-unconditioned",
        "MUTANT_RENEW_UNCONDITIONED",
        "the lease renewal writes without its checks and without the version condition",
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
    Mutant(
        "take-over-live",
        "MUTANT_TAKE_OVER_LIVE",
        "a newer delivery of a message running in its process takes the job over at once, "
        "its live lease included",
    ),
    Mutant(
        "owner-mark-unconditioned",
        "MUTANT_OWNER_MARK_UNCONDITIONED",
        "the owner marks its review sent without the version condition",
    ),
    Mutant(
        "pending-mark-unconditioned",
        "MUTANT_PENDING_MARK_UNCONDITIONED",
        "a delivery that published a pending review marks it sent without the version condition",
    ),
    Mutant(
        "settle-without-epoch",
        "MUTANT_SETTLE_WITHOUT_EPOCH",
        "a refused write, read again, is sent again without its epoch compared",
        equivalent="a delivery claims at most once, and every claim, release and replay moves "
        "the epoch and the delivery or the status together: the delivery and the status "
        "compared imply the epoch",
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


# -- coverage: every branch of the model taken -------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One transition of a process of the model, as ``pan -d`` lists it."""

    proctype: str
    source: int
    """The local state it leaves."""
    forward: int
    """pan's number for it, the index of its peg count (1 and 2 are shared, see below)."""
    target: int
    line: int
    text: str


_UNCONDITIONAL = 1
"""pan's shared number of ``skip``/``true``, ``goto`` and ``break``: taken once reached."""
_ELSE = 2
"""pan's shared number of every ``else``: taken when its target is reached from it alone."""

_TRANSITION = re.compile(
    r"\s*state\s+(\d+) -\(tr\s+(\d+)\)-> state\s+(\d+)\s+\[id\s+\d+ tp\s+[\d,]+\]"
    r" \[[^\]]*\] \S+:(\d+) => (.*)$"
)


def parse_transitions(listing: str) -> list[Transition]:
    """The transitions of the model's processes in ``pan -d``'s listing (no never claim's). Pure."""
    found: list[Transition] = []
    proctype: str | None = None
    for raw in listing.splitlines():
        line = raw.strip()
        if line.startswith("proctype "):
            proctype = line.removeprefix("proctype ")
        elif line == "init":
            proctype = "init"
        elif line.startswith("claim "):
            proctype = None
        elif proctype is not None and (match := _TRANSITION.match(raw)):
            source, forward, target, number = (int(match.group(i)) for i in range(1, 5))
            found.append(Transition(proctype, source, forward, target, number, match.group(5)))
    return found


def parse_pegs(output: str) -> dict[int, int]:
    """How often each transition ran (``gcc -DPEG``), by pan's number for it. Pure."""
    _, marker, counts = output.partition("Peg Counts")
    if not marker:
        raise ValueError("no peg counts in pan's output (build it with -DPEG)")
    return {
        int(match.group(2)): int(match.group(1))
        for match in re.finditer(r"^\s*(\d+)\s+trans\s+(\d+)\s", counts, re.MULTILINE)
    }


def parse_unreached(output: str) -> set[tuple[str, int]]:
    """The local states no run reached, as ``(proctype, state)`` (pan without ``-n``). Pure."""
    unreached: set[tuple[str, int]] = set()
    proctype: str | None = None
    for raw in output.splitlines():
        if header := re.match(r"unreached in (proctype (\S+)|init|claim \S+)$", raw.strip()):
            kind = header.group(1)
            proctype = None if kind.startswith("claim") else header.group(2) or "init"
        elif proctype is not None and (match := re.match(r"\s+\S+:\d+, state (\d+),", raw)):
            unreached.add((proctype, int(match.group(1))))
    return unreached


@dataclass(frozen=True)
class Dead:
    """A statement of the model (every copy of it, for an inline or a macro) no run takes."""

    proctype: str
    line: int
    text: str
    seen: bool = True
    """False for an ``else`` whose taking the counts cannot show: it needs a statement of its
    own after it (the model's ``nothing``)."""


def dead_code(
    transitions: Sequence[Transition], pegs: dict[int, int], unreached: set[tuple[str, int]]
) -> list[Dead]:
    """The statements of the model that no run takes, in the order of the model. Pure.

    A statement is taken when its peg count is positive (a process's ``-end-`` is not a
    statement). pan shares one number among every
    ``skip``, ``goto`` and ``break`` (taken once its state is reached) and one among every
    ``else`` (taken when the state it leads to is reached and only it leads there). Copies of
    one statement (an inline's, a macro's on one line) count together: one taken is enough.
    """
    into: dict[tuple[str, int], int] = {}
    for t in transitions:
        into[t.proctype, t.target] = into.get((t.proctype, t.target), 0) + 1
    taken: dict[tuple[str, int, str], list[bool | None]] = {}
    for t in transitions:
        if t.text == "-end-":
            continue  # where a process stops: the threads and the operator never do
        if t.forward == _UNCONDITIONAL:
            fired: bool | None = (t.proctype, t.source) not in unreached
        elif t.forward == _ELSE:
            alone = into[t.proctype, t.target] == 1
            fired = (t.proctype, t.target) not in unreached if alone else None
        else:
            fired = pegs.get(t.forward, 0) > 0
        taken.setdefault((t.proctype, t.line, t.text), []).append(fired)
    return [
        Dead(proctype, line, text, seen=None not in fired)
        for (proctype, line, text), fired in sorted(taken.items(), key=lambda item: item[0][1])
        if True not in fired
    ]


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
    dead: tuple[Dead, ...] | None = None
    """The model's statements no run took (a search that counted them and held), else None."""


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
    coverage: bool = False
    """Count how often each statement runs (``-DPEG``) and list the states never reached."""

    def spin_flags(self) -> list[str]:
        # -o3: no statement merging (pan's peg counts need it; it stores fewer states here).
        flags = ["-o3", *(f"-D{name}" for name in self.defines)]
        return [*flags, "-DBFS_TRAILS"] if self.shortest else flags

    def gcc_flags(self) -> list[str]:
        flags = ["-O0", f"-DMEMLIM={MEMORY_LIMIT_MB}", *(["-DPEG"] if self.coverage else [])]
        if self.liveness:
            return [*flags, "-DNFAIR=3"] if self.fair else flags
        return [*flags, "-DSAFETY", "-DNOCLAIM", *(["-DBFS"] if self.shortest else [])]

    def pan_flags(self) -> list[str]:
        # -n: no list of unreached states, but where coverage wants it.
        flags = [*([] if self.coverage else ["-n"]), f"-m{MAX_DEPTH}", f"-w{HASH_BITS}"]
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
    breadth_first = dataclasses.replace(search, shortest=True, coverage=False)
    shortest = _search(breadth_first, workdir, label)
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
    output = _run(["./pan", *search.pan_flags()], workdir)
    result = parse_pan(output)
    story: list[str] = []
    failed: str | None = None
    dead: tuple[Dead, ...] | None = None
    if result.errors:
        replay = _run(["spin", "-t", *search.spin_flags(), MODEL.name], workdir)
        story, line = trail_story(replay)
        if search.liveness:
            failed = "settles"
        elif line is not None:
            model_text = MODEL.read_text(encoding="utf-8")
            failed = property_at(model_text, line)
            story.append(failed_assertion(model_text, line))
    elif search.coverage and result.complete:
        transitions = parse_transitions(_run(["./pan", "-d"], workdir))
        dead = tuple(dead_code(transitions, parse_pegs(output), parse_unreached(output)))
    return Check(label, result, story, failed, time.monotonic() - started, dead)


# -- checking the model and the mutants -----------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A property's verdict on the model, with the run it came from."""

    prop: Property
    check: Check
    holds: bool


def check_safety(
    props: Sequence[Property], faults: int, workdir: Path, *, coverage: bool = True
) -> list[Verdict]:
    """One search for all ``props``; each violated one is named, and the rest searched again.

    Each search also counts the model's statements (``coverage``): the one that holds, over
    the whole state space, says which no run takes (assertions do not change the states).
    """
    verdicts: list[Verdict] = []
    left = list(props)
    while left:
        defines = (f"MAXF={faults}", *(p.macro for p in left))
        label = "safety: " + ", ".join(p.name for p in left)
        search = Search(defines, liveness=False, coverage=coverage)
        check = run_search(search, workdir, label)
        culprit = next((p for p in left if p.name == check.failed), None)
        if check.result.holds or culprit is None:
            verdicts += [Verdict(p, check, check.result.holds) for p in left]
            break
        verdicts.append(Verdict(culprit, check, False))
        left.remove(culprit)
    return verdicts


def check_liveness(prop: Property, faults: int, fair: bool, workdir: Path) -> Verdict:
    """The liveness property ``prop`` on the model (acceptance cycles, or weak fairness)."""
    search = Search((f"MAXF={faults}",), liveness=True, fair=fair)
    check = run_search(search, workdir, f"liveness: {prop.name}")
    return Verdict(prop, check, check.result.holds)


def coverage_of(verdicts: Sequence[Verdict]) -> tuple[Dead, ...] | None:
    """What no run of the model takes, from the safety search that held (None: none did)."""
    return next((v.check.dead for v in verdicts if v.check.dead is not None), None)


@dataclass(frozen=True)
class MutantVerdict:
    """A mutant's verdict: refuted (or, named equivalent, changing nothing), or not."""

    mutant: Mutant
    check: Check
    ok: bool
    text: str


def check_mutant(
    mutant: Mutant,
    faults: int,
    workdir: Path,
    model: Callable[[], PanResult | None] = lambda: None,
) -> MutantVerdict:
    """The mutant against every safety property, then the liveness one.

    An equivalent mutant's safety search must hold with the model's own states and
    transitions: ``model()`` gives the model's safety search at the same faults when it held
    (None: it is searched here).
    """
    safety = tuple(p.macro for p in PROPERTIES if not p.liveness)
    defines = (f"MAXF={faults}", mutant.macro, *safety)
    check = run_search(Search(defines, liveness=False), workdir, mutant.name)
    if mutant.equivalent:
        reference = model()
        if reference is None:
            plain = Search((f"MAXF={faults}",), liveness=False)
            reference = _search(plain, workdir, "model").result
        same = (check.result.stored, check.result.transitions) == (
            reference.stored,
            reference.transitions,
        )
        if check.result.holds and same:
            return MutantVerdict(mutant, check, True, "equivalent: the same states")
        return MutantVerdict(mutant, check, False, "NOT EQUIVALENT")
    if not check.result.errors:
        search = Search((f"MAXF={faults}", mutant.macro), liveness=True)
        check = run_search(search, workdir, mutant.name)
    if check.result.errors:
        return MutantVerdict(mutant, check, True, f"refuted by {check.failed}")
    return MutantVerdict(mutant, check, False, "NOT REFUTED")


@dataclass(frozen=True)
class Outcome:
    """Everything one invocation checked."""

    verdicts: list[Verdict]
    mutants: list[MutantVerdict] | None


def check_all(
    props: Sequence[Property],
    mutants: Sequence[Mutant] | None,
    *,
    faults: int,
    fair: bool,
    workdir: Path,
    jobs: int,
) -> Outcome:
    """The properties, then the mutants, searched ``jobs`` at a time (each in a directory
    of its own under ``workdir``); the results in the order asked for."""
    safety = [p for p in props if not p.liveness]
    places = (workdir / f"search-{n}" for n in itertools.count(1))

    def place() -> Path:
        path = next(places)
        path.mkdir(parents=True, exist_ok=True)
        return path

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        safety_run = pool.submit(check_safety, safety, faults, place()) if safety else None
        liveness_runs = [
            pool.submit(check_liveness, p, faults, fair, place()) for p in props if p.liveness
        ]

        def model() -> PanResult | None:
            held = [v for v in safety_run.result() if v.holds] if safety_run else []
            return held[0].check.result if held else None

        mutant_runs = [
            pool.submit(check_mutant, m, faults, place(), model) for m in (mutants or ())
        ]
        verdicts = list(safety_run.result()) if safety_run else []
        verdicts += [r.result() for r in liveness_runs]
        checked = [r.result() for r in mutant_runs] if mutants is not None else None
    order = {p.name: n for n, p in enumerate(PROPERTIES)}
    verdicts.sort(key=lambda v: order[v.prop.name])
    return Outcome(verdicts, checked)


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
        implied = verdict.prop.implied_by
        return f"holds (implied by {implied})" if implied else "holds"
    if verdict.check.result.errors:
        return "VIOLATED"
    return "INCOMPLETE"


def print_model(verdicts: Sequence[Verdict], faults: int) -> None:
    print(
        f"model/protocol.pml: 1 job, 2 messages, 2 workers (3 callback threads), "
        f"at most {faults} faults per run"
    )
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


def print_coverage(dead: Sequence[Dead] | None, faults: int) -> bool:
    """Say which of the model's statements no run takes; True when every one is taken."""
    if dead is None:
        return True  # no safety search held: nothing to say (a failure is reported already)
    if faults < DEFAULT_FAULTS:
        print(f"branches of the model: not checked below {DEFAULT_FAULTS} faults per run")
        return True
    if not dead:
        print("branches of the model: every one is taken in some run")
        return True
    print("\nDEAD MODEL CODE: no run takes these statements (a guard that never fires, or a")
    print("branch the search never reaches; an `else` needs a statement of its own: `nothing`):")
    for d in dead:
        seen = "" if d.seen else "  (an else not seen: give it `nothing`)"
        print(f"  model/protocol.pml:{d.line} ({d.proctype}): {d.text}{seen}")
    return False


def print_mutants(verdicts: Sequence[MutantVerdict]) -> None:
    rows = [[v.mutant.name, v.text, *_numbers(v.check.result)] for v in verdicts]
    print()
    print(_table(["mutant", "verdict", *_NUMBERS], rows))
    for v in verdicts:
        if v.check.result.errors:
            _print_story(f"{v.mutant.name} ({v.mutant.what}), refuted by {v.check.failed}", v.check)
        elif v.mutant.equivalent:
            print(f"\n{v.mutant.name} ({v.mutant.what}) is equivalent: {v.mutant.equivalent}")


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
    parser.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"searches at a time (default {DEFAULT_JOBS}: the verifier uses one core each)",
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
    chosen = None
    if args.mutants is not None:
        chosen = [m for m in MUTANTS if not args.mutants or m.name in args.mutants]
    with _workdir(args.keep) as workdir:
        outcome = check_all(
            props, chosen, faults=args.faults, fair=args.fair, workdir=workdir, jobs=args.jobs
        )
    print_model(outcome.verdicts, args.faults)
    covered = print_coverage(coverage_of(outcome.verdicts), args.faults)
    failed = not all(v.holds for v in outcome.verdicts) or not covered
    if outcome.mutants is not None:
        print_mutants(outcome.mutants)
        failed = failed or not all(v.ok for v in outcome.mutants)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
