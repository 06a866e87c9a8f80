"""The seeded chaos run (``python -m benchmarks.chaos``): it passes, and it can fail.

Two real runs on the session's emulators, each a fleet of four
``pubsub-worker run`` processes under every fault kind:

* the CI run (``--short``, the fixed CI seed) holds every invariant, and
  every fault kind struck;
* the same run with the version precondition of step commits switched off
  (``--unfenced``: a job store that writes over whatever version it finds)
  reports the business writes it doubled, names the jobs and the seed, and
  fails. A check that cannot fail proves nothing.

And one run of the library beside the baseline users would write instead
(``--baseline``): the same kills leave the baseline's jobs stuck, not the
library's.

And, without emulators, the pieces a run is built from: the schedule is a
function of the seed, rates parse strictly, the checker flags what it must.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.chaos import CI_SEED, parse_args, run_chaos
from benchmarks.chaos.injector import Kill
from benchmarks.chaos.report import render
from benchmarks.chaos.schedule import (
    DEFAULT_RATES,
    SHORT_RATES,
    Fault,
    build_schedule,
    parse_rates,
)
from benchmarks.chaos.verify import Evidence, recoveries, verify
from emulator import Emulators

RUN_TIMEOUT_S = 240
"""Each run is bounded by its own time limit; this only catches a hang of the harness."""
KILLS_BOTH_SEED = 2
"""A seed whose kills (6 a minute, two workers) strike w0 at 7.2 s and w1 at 12.8 s."""


def short_run(*extra: str, seed: int = CI_SEED) -> list[str]:
    """The CI run's command line (another ``seed`` if given), with ``extra`` arguments."""
    return ["--short", "--seed", str(seed), "--json", "-", *extra]


@pytest.fixture
def progress() -> Iterator[io.StringIO]:
    """Where a run's progress lines go; shown when a test fails."""
    out = io.StringIO()
    yield out
    print(out.getvalue())


@pytest.mark.emulator
@pytest.mark.chaos
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_short_run_under_every_fault_kind_loses_and_doubles_nothing(
    emulators: Emulators, progress: io.StringIO, tmp_path: Any
) -> None:
    """The CI run: every job completed or failed, each effect once, every fault kind struck."""
    (options,) = parse_args(short_run("--log-dir", str(tmp_path)))
    report = run_chaos(options, emulators=emulators, out=progress)

    summary = render(report)
    assert report["ok"], summary
    figures, events = report["figures"], report["events"]
    assert (figures["lost"], figures["doubled_business_writes"], figures["doubled_outputs"]) == (
        0,
        0,
        0,
    )
    assert figures["left_unacked"] == 0
    assert figures["completed"] + figures["failed"] == options.jobs
    struck = {fault.value: events[fault.value] for fault in Fault}
    assert all(struck.values()), f"fault kinds that never struck: {struck}\n{summary}"
    assert report["subscription"]["retry_policy"] is None
    assert f"--seed {CI_SEED}" in report["command"]


@pytest.mark.emulator
@pytest.mark.chaos
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)  # at most two runs
def test_the_same_run_without_the_fence_reports_doubled_writes_and_the_seed(
    emulators: Emulators, progress: io.StringIO, tmp_path: Any
) -> None:
    """Step commits without their version precondition: stale owners' writes land twice.

    A worker cut off from the network past the lease still has the job's
    transactional step to commit; another worker claims the job and writes
    it. When the network heals, only the precondition stops the first
    worker's commit. Without it the business write lands twice, and the run
    must say so, name the jobs and the seed, and fail.

    The same seed and isolations as the CI run, the other faults off: with
    them, a pause or a modack error window can also hold up the redelivery
    that hands the job to another worker before the network heals, and
    whether a stale commit comes at all becomes a matter of luck. Twice the
    jobs at twice the rate, so that every isolated worker holds several jobs
    (at the CI run's rate a worker holds about three, and on a loaded machine
    four isolations once caught none inside its transactional step).

    Whether an isolation catches a commit on its way out is still a matter
    of timing, not of the seed alone (a stale owner that has not sent its
    commit yet is stopped by its lost delivery, fence or no fence): when the
    CI seed's run doubles nothing, the next seeds run, up to two more (two
    in a row once caught none, two isolations in the second). A checker
    that cannot see a doubled write fails them all.
    """
    for seed in (CI_SEED, CI_SEED + 1, CI_SEED + 2):
        # A lower time limit: a store without a fence can also leave a job stuck for good.
        (options,) = parse_args(
            short_run(
                *("--unfenced", "--off", "all", "--rate", "isolate=6", "--time-limit", "90"),
                *("--jobs", "800", "--publish-rate", "28"),
                seed=seed,
            )
        )
        report = run_chaos(options, emulators=emulators, out=progress)
        figures = report["figures"]
        if figures["doubled_business_writes"] + figures["doubled_outputs"] > 0:
            break

    summary = render(report)
    assert not report["ok"], summary
    assert figures["doubled_business_writes"] + figures["doubled_outputs"] > 0, summary
    failed = {check["name"]: check for check in report["checks"] if not check["ok"]}
    doubled = failed.get("business write once per job") or failed["one output per job"]
    assert doubled["jobs"], doubled
    assert f"--seed {seed}" in report["command"]
    assert "--unfenced" in report["command"]
    assert "Reproduce with the same seed" in summary


@pytest.mark.emulator
@pytest.mark.chaos
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_kills_leave_the_marker_baselines_jobs_stuck_and_the_librarys_finished(
    emulators: Emulators, progress: io.StringIO, tmp_path: Any
) -> None:
    """The same seed and kills against the library and the stock client with a create-only
    marker per message id written before the work (``--baseline before``).

    A worker killed mid-job leaves the job's marker behind: every redelivery
    finds it, acks and skips, so each job a killed baseline worker had begun
    and not finished is stuck for good, and the run counts exactly those.
    The library's fleet, killed on the same schedule while it held jobs too,
    finishes every one of them. Kills only, two small fleets at the same
    time (``--parallel``), so that it stays short; jobs of 2-3 s, so that
    each worker holds several when it is killed.

    Whether a kill finds a baseline worker between a marker and its job's end
    is a matter of timing too: on a loaded machine a restarted stock worker
    can still be starting when the next kill comes. When the first seed's
    kills catch no baseline job, the next seeds run, up to two more; the
    library finishes every job in every run.
    """
    for seed in (KILLS_BOTH_SEED, KILLS_BOTH_SEED + 1, KILLS_BOTH_SEED + 2):
        (options,) = parse_args(
            [
                *("--short", "--seed", str(seed), "--json", "-"),
                *("--baseline", "before", "--parallel", "--log-dir", str(tmp_path / str(seed))),
                *("--workers", "2", "--jobs", "60", "--publish-rate", "4"),
                *("--prepare-ms", "2000-3000", "--off", "all", "--rate", "kill=6"),
                *("--fault-time", "15", "--time-limit", "90"),
            ]
        )
        report = run_chaos(options, emulators=emulators, out=progress)

        summary = render(report)
        assert report["ok"], summary
        (before,) = report["baseline"]
        assert before["handler"] == "before"
        library, baseline = report["tally"], before["tally"]
        counts = ("lost", "doubled_writes", "doubled_outputs", "stuck")
        assert [library[name] for name in counts] == [0, 0, 0, 0], summary
        library_kills = report["figures"]["recoveries"]
        assert not [kill["unfinished"] for kill in library_kills if kill["unfinished"]], summary
        held = {job for kill in before["figures"]["recoveries"] for job in kill["unfinished"]}
        if held and any(kill["jobs_held"] for kill in library_kills):
            break  # the schedule's kills caught jobs in both fleets' hands
    assert any(kill["jobs_held"] for kill in library_kills), summary
    assert held, f"no kill caught a baseline job between its marker and its end\n{summary}"
    assert set(baseline["named"]["stuck"]) == held, summary
    assert baseline["named"]["lost"] == baseline["named"]["stuck"], summary
    assert before["markers"] == options.jobs  # every job's first delivery created one
    assert f"| jobs lost (never completed, not in the failure path) | 0 | {len(held)} |" in summary


# -- the pieces, without emulators ------------------------------------------------------


def test_the_schedule_is_a_function_of_the_seed_and_each_kind_has_its_own_stream() -> None:
    def schedule(seed: int, rates: Any) -> list[Any]:
        return build_schedule(seed, rates, workers=4, horizon_s=120, lease_s=10)

    assert schedule(7, DEFAULT_RATES) == schedule(7, DEFAULT_RATES)
    assert schedule(7, DEFAULT_RATES) != schedule(8, DEFAULT_RATES)
    without_kills = schedule(7, {**DEFAULT_RATES, Fault.KILL: 0})
    assert [e for e in schedule(7, DEFAULT_RATES) if e.fault is not Fault.KILL] == without_kills
    firsts = [e for e in schedule(7, DEFAULT_RATES) if e.first]
    assert sorted(e.fault.value for e in firsts) == sorted(f.value for f in Fault)
    pauses = [e for e in schedule(7, DEFAULT_RATES) if e.fault is Fault.PAUSE]
    assert pauses
    assert all(e.duration_s > 10 for e in pauses)  # past the lease


def test_the_fence_test_isolates_the_workers_the_ci_run_isolates() -> None:
    isolations = [
        event
        for event in build_schedule(CI_SEED, SHORT_RATES, workers=4, horizon_s=60, lease_s=10)
        if event.fault is Fault.ISOLATE
    ]
    only = parse_rates(["isolate=6"], ["all"], base=SHORT_RATES)
    assert build_schedule(CI_SEED, only, workers=4, horizon_s=60, lease_s=10) == isolations
    assert isolations
    assert all(event.duration_s > 10 for event in isolations)  # past the lease


def test_rates_parse_strictly() -> None:
    rates = parse_rates(["kill=10"], ["pause"])
    assert (rates[Fault.KILL], rates[Fault.PAUSE]) == (10.0, 0.0)
    only = parse_rates(["cut-pubsub=3"], ["all"])
    assert {f for f, rate in only.items() if rate} == {Fault.CUT_PUBSUB}
    for bad in (["kil=1"], ["kill"], ["kill=-1"], ["kill=x"]):
        with pytest.raises(ValueError, match="kil"):
            parse_rates(bad, [])


def _evidence(**changes: Any) -> Evidence:
    """Three healthy jobs and a poison one, each effect once, then ``changes``."""
    docs: dict[str, dict[str, Any]] = {
        key: {"status": "completed"} for key in ("job-1", "job-2", "job-3")
    }
    docs["job-4"] = {"status": "failed", "reason": "permanent"}
    fields: dict[str, Any] = {
        "poison": {"job-1": False, "job-2": False, "job-3": False, "job-4": True},
        "docs": docs,
        "business_writes": {"job-1": 1, "job-2": 1, "job-3": 1},
        "outputs": {"job-1:emit:0": 1, "job-2:emit:0": 2, "job-3:emit:0": 1},
        "output_jobs": {"job-1:emit:0": "job-1", "job-2:emit:0": "job-2", "job-3:emit:0": "job-3"},
        "failure_messages": {"job-4": 1},
        "plain_effects": {"job-1": 1, "job-2": 2, "job-3": 1},
        "begins": [],
        "left_unacked": [],
    }
    fields.update(changes)
    return Evidence(**fields)


def _broken(evidence: Evidence) -> dict[str, tuple[str, ...]]:
    checks, _ = verify(evidence)
    return {check.name: check.jobs for check in checks if not check.ok}


def test_the_checker_passes_effects_once_and_counts_dropped_copies() -> None:
    checks, figures = verify(_evidence())
    assert all(check.ok for check in checks), checks
    assert (figures["copies_dropped"], figures["plain_effects_repeated_jobs"]) == (1, 1)


def test_the_checker_names_the_jobs_it_catches() -> None:
    assert _broken(_evidence(business_writes={"job-1": 2, "job-2": 1, "job-3": 1})) == {
        "business write once per job": ("job-1",)
    }
    two_keys = {"job-1:emit:0": "job-1", "job-1:emit:1": "job-1", "job-2:emit:0": "job-2"}
    assert _broken(_evidence(output_jobs={**two_keys, "job-3:emit:0": "job-3"})) == {
        "one output per job": ("job-1",)
    }
    docs = {**_evidence().docs, "job-3": {"status": "running"}}
    assert _broken(_evidence(docs=docs)) == {"nothing lost": ("job-3",)}
    assert _broken(_evidence(left_unacked=["job-2"])) == {"nothing left unacked": ("job-2",)}
    assert _broken(_evidence(failure_messages={})) == {
        "failure path message of every failed job": ("job-4",)
    }


def test_recovery_after_a_kill_is_when_the_last_job_it_held_was_finished_elsewhere() -> None:
    from datetime import datetime, timezone

    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t, timezone.utc)

    docs = {"a": {"completed_at": at(130.0)}, "b": {"completed_at": at(112.0)}}
    docs["c"] = {"completed_at": at(99.0)}  # finished before the kill
    begins = [("a", 7, 95.0), ("b", 7, 96.0), ("c", 7, 90.0), ("a", 8, 125.0)]
    (recovery,) = recoveries([Kill(100.0, 12.0, "w0", 7)], begins, docs)
    assert (recovery["jobs"], recovery["recovered_in_s"]) == (["a", "b"], 30.0)
