"""The library against the baseline: the same counts for each run, side by side. Pure.

Each run, the library's or a baseline's (:mod:`benchmarks.chaos.baseline`),
is counted from what it left outside its workers, the same way:

* **jobs lost**: published, and never completed nor in the failure path. A
  healthy job is completed when its business write landed and its output
  reached the downstream consumer (the last step); a poison job is in the
  failure path when its message reached the failure topic.
* **business writes doubled**: jobs with more than one document in the
  sink collection.
* **outputs doubled**: jobs with more than one distinct output (effect
  key) at the downstream consumer: outputs a consumer keyed on the effect
  key would take as two.
* **stuck jobs**: lost jobs that a record says are taken or done (a marker
  for the baseline, a job document for the library): nothing will ever run
  them again, as every delivery finds the record and stops. The run has
  already checked that no message of theirs is left on the subscription.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.chaos.verify import Check

__all__ = ["LABELS", "Tally", "baseline_checks", "render_comparison", "tally"]

LABELS = {
    "library": "library",
    "before": "marker before the work",
    "after": "marker after the work",
}
"""Column headings, by what the fleet ran."""


@dataclass(frozen=True)
class Tally:
    """The counts of one run, each with the jobs behind it (sorted)."""

    jobs: int
    completed: tuple[str, ...]
    failed: tuple[str, ...]
    lost: tuple[str, ...]
    doubled_writes: tuple[str, ...]
    doubled_outputs: tuple[str, ...]
    stuck: tuple[str, ...]
    poison_not_failed: tuple[str, ...]
    business_writes: int

    def as_json(self) -> dict[str, Any]:
        """Counts and job lists, for the report."""
        lists = ("lost", "doubled_writes", "doubled_outputs", "stuck", "poison_not_failed")
        return {
            "jobs": self.jobs,
            "completed": len(self.completed),
            "failed": len(self.failed),
            "business_writes": self.business_writes,
            **{name: len(getattr(self, name)) for name in lists},
            "named": {name: list(getattr(self, name)) for name in lists},
        }


def tally(
    *,
    poison: Mapping[str, bool],
    business_writes: Mapping[str, int],
    output_jobs: Mapping[str, str],
    failure_messages: Mapping[str, int],
    records: Collection[str],
) -> Tally:
    """Count one run. ``records``: jobs that have a marker (or a job document)."""
    distinct: dict[str, int] = {}
    for job in output_jobs.values():
        distinct[job] = distinct.get(job, 0) + 1
    jobs = sorted(poison)
    completed = [
        j for j in jobs if not poison[j] and business_writes.get(j, 0) and distinct.get(j, 0)
    ]
    failed = [j for j in jobs if failure_messages.get(j, 0)]
    finished = set(completed) | set(failed)
    lost = [j for j in jobs if j not in finished]
    return Tally(
        jobs=len(jobs),
        completed=tuple(completed),
        failed=tuple(failed),
        lost=tuple(lost),
        doubled_writes=tuple(j for j in jobs if business_writes.get(j, 0) > 1),
        doubled_outputs=tuple(j for j in jobs if distinct.get(j, 0) > 1),
        stuck=tuple(j for j in lost if j in records),
        poison_not_failed=tuple(j for j in jobs if poison[j] and not failure_messages.get(j, 0)),
        business_writes=sum(business_writes.get(j, 0) for j in jobs),
    )


def baseline_checks(counted: Tally, left_unacked: Sequence[str]) -> list[Check]:
    """The invariants of the chaos run that a baseline run can be held to, from its tally."""

    def check(name: str, breaking: Sequence[str], detail: str) -> Check:
        return Check(name, not breaking, detail, tuple(breaking))

    return [
        check(
            "nothing lost",
            counted.lost,
            f"{len(counted.completed)} completed + {len(counted.failed)} in the failure path, "
            f"of {counted.jobs}; {len(counted.stuck)} of the lost held by a marker",
        ),
        check(
            "poison jobs in the failure path",
            counted.poison_not_failed,
            f"{len(counted.poison_not_failed)} poison jobs without a failure message",
        ),
        check(
            "business write once per job",
            counted.doubled_writes,
            f"{counted.business_writes} writes for {len(counted.completed)} completed jobs; "
            f"{len(counted.doubled_writes)} jobs written more than once",
        ),
        check(
            "one output per job",
            counted.doubled_outputs,
            f"{len(counted.doubled_outputs)} jobs with more than one distinct output",
        ),
        check(
            "nothing left unacked",
            sorted(set(left_unacked)),
            f"{len(left_unacked)} messages on the subscription once the fleet stopped",
        ),
    ]


def _faults(events: Mapping[str, Any]) -> str:
    cuts = events.get("cut-pubsub", 0) + events.get("cut-firestore", 0)
    partitions = events.get("partition-pubsub", 0) + events.get("partition-firestore", 0)
    windows = events.get("ack-errors", 0) + events.get("modack-errors", 0)
    windows += events.get("slow-firestore", 0)
    return (
        f"{events.get('kill', 0)}, {events.get('pause', 0)}, {cuts}, {partitions}, "
        f"{events.get('isolate', 0)}, {windows}"
    )


def render_comparison(reports: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table of runs of one seed (the library's first), in Markdown."""
    heads = [LABELS.get(r["handler"], r["handler"]) for r in reports]
    counts = [r["tally"] for r in reports]
    rows: list[tuple[str, list[str]]] = [
        ("jobs lost (never completed, not in the failure path)", [str(c["lost"]) for c in counts]),
        ("business writes doubled (jobs)", [str(c["doubled_writes"]) for c in counts]),
        ("outputs doubled (jobs)", [str(c["doubled_outputs"]) for c in counts]),
        (
            "stuck jobs (a record says taken or done; never finished)",
            [str(c["stuck"]) for c in counts],
        ),
        (
            "jobs completed / in the failure path, of",
            [f"{c['completed']} / {c['failed']}, {c['jobs']}" for c in counts],
        ),
        (
            "faults applied: kills, pauses, cuts, partitions, isolations, error or slow windows",
            [_faults(r["events"]) for r in reports],
        ),
        (
            "redeliveries by Pub/Sub (messages redelivered)",
            [
                f"{r['events']['redeliveries']} ({r['events']['redelivered_messages']})"
                for r in reports
            ],
        ),
        (
            "drained at",
            [
                "n/a" if r["phases"]["drained_s"] is None else f"{r['phases']['drained_s']:.0f} s"
                for r in reports
            ],
        ),
    ]
    lines = [
        f"#### Library and baseline, seed {reports[0]['seed']}",
        "",
        "| | " + " | ".join(heads) + " |",
        "| --- |" + " --- |" * len(heads),
    ]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(lines) + "\n"
