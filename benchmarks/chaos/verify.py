"""The invariants of a chaos run, checked on what it left behind. Pure.

:class:`Evidence` is everything counted after the fleet stopped: the job
documents, the business writes in the sink collection, the outputs the
keyed consumer received, the failure topic, the workers' effect lines, and
the messages a pull still found on the subscription. :func:`verify` turns it
into :class:`Check` results (each names the jobs that break it) and the
figures of the summary.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from benchmarks.chaos.injector import Kill

__all__ = ["Check", "Evidence", "recoveries", "verify"]

SHOWN_JOBS = 20
"""Jobs named per failed check (the JSON report has them all)."""


@dataclass
class Evidence:
    """What the run left behind, by job key."""

    poison: Mapping[str, bool]
    """Every published job, and whether it is a poison job."""
    docs: Mapping[str, Mapping[str, Any]]
    """Job documents (fields as stored), by their ``key`` field."""
    business_writes: Mapping[str, int]
    """Documents in the sink collection per job."""
    outputs: Mapping[str, int]
    """Messages the keyed consumer received per effect key."""
    output_jobs: Mapping[str, str]
    """The job (``job`` attribute) of each effect key."""
    failure_messages: Mapping[str, int]
    """Messages on the failure topic per job."""
    plain_effects: Mapping[str, int]
    """Side effects of the plain step per job (at least once)."""
    begins: Sequence[tuple[str, int, float]]
    """``(job, pid, wall time)`` of every handler start."""
    left_unacked: Sequence[str]
    """Jobs whose message a pull still found after the fleet stopped."""
    kills: Sequence[Kill] = field(default_factory=list)
    timed_out: bool = False
    """The time limit stopped the run before the fleet drained."""


@dataclass(frozen=True)
class Check:
    """One invariant: held or not, in words, and the jobs that break it."""

    name: str
    ok: bool
    detail: str
    jobs: tuple[str, ...] = ()


def _finished_at(doc: Mapping[str, Any]) -> float | None:
    for name in ("completed_at", "failed_at"):
        value = doc.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
    return None


def recoveries(
    kills: Sequence[Kill],
    begins: Sequence[tuple[str, int, float]],
    docs: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Per kill: the jobs the killed process had started and not finished, how long until
    the last of them was finished by another process (None: never), and those never
    finished (``unfinished``)."""
    done = {key: _finished_at(doc) for key, doc in docs.items()}
    out: list[dict[str, Any]] = []
    for kill in kills:
        held = {
            job
            for job, pid, at in begins
            if pid == kill.pid and at <= kill.at_wall and (done.get(job) or math.inf) > kill.at_wall
        }
        ends = [done.get(job) or math.inf for job in held]
        last = max(ends, default=kill.at_wall)
        out.append(
            {
                "at_s": round(kill.at_s, 1),
                "worker": kill.worker,
                "pid": kill.pid,
                "at_wall": kill.at_wall,
                "jobs_held": len(held),
                "jobs": sorted(held),
                "unfinished": sorted(job for job in held if done.get(job) is None),
                "recovered_in_s": None if math.isinf(last) else round(last - kill.at_wall, 1),
            }
        )
    return out


def verify(evidence: Evidence) -> tuple[list[Check], dict[str, Any]]:
    """Check every invariant; return the checks and the figures of the summary."""
    jobs = sorted(evidence.poison)
    status = {key: str(evidence.docs.get(key, {}).get("status", "missing")) for key in jobs}
    reason = {key: str(evidence.docs.get(key, {}).get("reason", "")) for key in jobs}
    completed = [key for key in jobs if status[key] == "completed"]
    failed = [key for key in jobs if status[key] == "failed"]
    lost = [key for key in jobs if status[key] not in ("completed", "failed")]
    poison = [key for key in jobs if evidence.poison[key]]
    healthy = [key for key in jobs if not evidence.poison[key]]

    distinct: dict[str, set[str]] = {}
    for effect_key, job in evidence.output_jobs.items():
        distinct.setdefault(job, set()).add(effect_key)
    writes = evidence.business_writes
    plain = evidence.plain_effects
    healthy_done = [k for k in completed if not evidence.poison[k]]
    wrong_outcome = [k for k in poison if (status[k], reason[k]) != ("failed", "permanent")]
    doubled_writes = [k for k in jobs if writes.get(k, 0) > 1]
    missing_writes = [k for k in healthy_done if writes.get(k, 0) == 0]
    poison_writes = [k for k in poison if writes.get(k, 0)]
    doubled_outputs = [k for k in jobs if len(distinct.get(k, ())) > 1]
    stray = sorted(k for k, job in evidence.output_jobs.items() if job not in evidence.poison)
    missing_outputs = [k for k in healthy_done if not distinct.get(k)]
    missing_plain = [k for k in completed if plain.get(k, 0) == 0]
    unreported = [k for k in failed if evidence.failure_messages.get(k, 0) == 0]
    left = sorted(set(evidence.left_unacked))

    def check(name: str, breaking: list[str], detail: str) -> Check:
        return Check(name, not breaking, detail, tuple(breaking))

    checks = [
        check(
            "nothing lost",
            lost,
            f"{len(completed)} completed + {len(failed)} in the failure path, of {len(jobs)}"
            + (" (the time limit stopped the run first)" if evidence.timed_out and lost else ""),
        ),
        check(
            "poison jobs in the failure path",
            wrong_outcome,
            f"{len(poison)} poison jobs; {len(wrong_outcome)} not failed as permanent",
        ),
        check(
            "business write once per job",
            doubled_writes,
            f"{sum(writes.values())} writes for {len(healthy_done)} completed jobs; "
            f"{len(doubled_writes)} jobs written more than once",
        ),
        check(
            "business write of every completed job",
            missing_writes + poison_writes,
            f"{len(missing_writes)} completed jobs without it; "
            f"{len(poison_writes)} poison jobs with one",
        ),
        check(
            "one output per job",
            doubled_outputs + stray,
            f"{len(evidence.outputs)} distinct effect keys; {len(doubled_outputs)} jobs with "
            f"more than one; {len(stray)} of no job",
        ),
        check(
            "output of every completed job",
            missing_outputs,
            f"{len(missing_outputs)} completed jobs without one",
        ),
        check(
            "plain step ran for every completed job",
            missing_plain,
            f"{sum(plain.values())} side effects (at least once) for {len(completed)} "
            f"completed jobs; {len(missing_plain)} without",
        ),
        check(
            "failure path message of every failed job",
            unreported,
            f"{sum(evidence.failure_messages.values())} messages for {len(failed)} failed "
            f"jobs; {len(unreported)} without",
        ),
        check(
            "nothing left unacked",
            left,
            f"{len(evidence.left_unacked)} messages on the subscription once the fleet stopped",
        ),
    ]
    repeated = [k for k in jobs if evidence.plain_effects.get(k, 0) > 1]
    recovered = recoveries(evidence.kills, evidence.begins, evidence.docs)
    times = [r["recovered_in_s"] for r in recovered if r["jobs_held"] and r["recovered_in_s"]]
    figures: dict[str, Any] = {
        "jobs": len(jobs),
        "completed": len(completed),
        "failed": len(failed),
        "failed_poison": sum(1 for k in failed if evidence.poison[k]),
        "failed_reasons": dict(Counter(reason[k] for k in failed)),
        "failed_healthy": sorted(k for k in failed if not evidence.poison[k]),
        "lost": len(lost),
        "business_writes": sum(writes.values()),
        "doubled_business_writes": len(doubled_writes),
        "distinct_outputs": len(evidence.outputs),
        "doubled_outputs": len(doubled_outputs),
        "copies_dropped": sum(n - 1 for n in evidence.outputs.values() if n > 1),
        "plain_effects": sum(plain.values()),
        "plain_effects_repeated_jobs": len(repeated),
        "left_unacked": len(evidence.left_unacked),
        "healthy_jobs": len(healthy),
        "recoveries": recovered,
        "recovery_median_s": statistics.median(times) if times else None,
        "recovery_max_s": max(times) if times else None,
        "never_recovered": sum(1 for r in recovered if r["recovered_in_s"] is None),
    }
    return checks, figures
