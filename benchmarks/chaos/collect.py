"""Reading back what a run left behind: documents, messages, effect lines, counters, logs;
and :func:`account`, which reads it all and returns the run's report.

Everything here reads state the workers wrote or could not help leaving
(Firestore documents, a subscription, files); nothing here trusts what a
worker says about itself except the counters, which are marked as such.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from google.api_core import exceptions as gexc

from benchmarks.chaos.compare import Tally, baseline_checks, tally
from benchmarks.chaos.downstream import KeyedConsumer
from benchmarks.chaos.feeder import KEY_ATTRIBUTE
from benchmarks.chaos.fleet import Fleet
from benchmarks.chaos.injector import Injector
from benchmarks.chaos.ledger import Ledger
from benchmarks.chaos.options import Options
from benchmarks.chaos.schedule import Fault
from benchmarks.chaos.verify import Evidence, verify
from emulator import end_streams

__all__ = [
    "account",
    "business_writes",
    "effect_lines",
    "handovers",
    "job_documents",
    "left_unacked",
    "log_levels",
    "markers",
    "note_redeliveries",
    "run_events",
    "terminal_counts",
    "worker_counters",
]

MAX_HANDOVERS = 300
"""Jobs whose handover story is told (those run by more than one process)."""


def left_unacked(subscriber: Any, subscription: str, *, wait_s: float) -> list[str]:
    """Job keys of the messages the subscription hands out within ``wait_s``; they are acked.

    Call it once no worker consumes: a message not acked (dropped, nacked, or
    its ack refused) comes back within a lease of its last extension.
    """
    # A dead worker's stream can stay registered at the emulator and swallow a
    # redelivery; turning the subscription into a push one for an instant ends them all.
    end_streams(subscriber, subscription)
    left: list[str] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            response = subscriber.pull(
                request={
                    "subscription": subscription,
                    "max_messages": 500,
                    "return_immediately": True,
                },
                timeout=10,
            )
        except gexc.DeadlineExceeded:
            continue
        received = list(response.received_messages)
        if not received:
            time.sleep(0.25)
            continue
        left.extend(m.message.attributes.get(KEY_ATTRIBUTE, "?") for m in received)
        subscriber.acknowledge(
            request={"subscription": subscription, "ack_ids": [m.ack_id for m in received]}
        )
    return left


def terminal_counts(client: Any, collection: str) -> tuple[int, int] | None:
    """``(completed, failed)`` job documents, by count queries; None if Firestore did not answer."""
    from google.cloud.firestore_v1.base_query import FieldFilter  # noqa: PLC0415

    counts = []
    for status in ("completed", "failed"):
        query: Any = client.collection(collection).where(filter=FieldFilter("status", "==", status))
        try:
            result = query.count().get(timeout=10)
        except (gexc.GoogleAPICallError, gexc.RetryError):
            return None
        counts.append(int(result[0][0].value))
    return counts[0], counts[1]


def job_documents(client: Any, collection: str, subscription: str) -> dict[str, dict[str, Any]]:
    """The job documents of ``subscription``, by their ``key`` field (the stored layout)."""
    docs: dict[str, dict[str, Any]] = {}
    for snap in client.collection(collection).stream():
        fields = snap.to_dict() or {}
        if "key" in fields and fields.get("subscription") == subscription:
            docs[str(fields["key"])] = fields
    return docs


def business_writes(client: Any, sink: str) -> Counter[str]:
    """Documents in the sink collection, per job."""
    return Counter(
        str((snap.to_dict() or {}).get("job")) for snap in client.collection(sink).stream()
    )


def markers(client: Any, collection: str) -> dict[str, str]:
    """The baseline's markers: message id to the job each names."""
    return {
        snap.id: str((snap.to_dict() or {}).get("job"))
        for snap in client.collection(collection).stream()
    }


def effect_lines(path: Path) -> list[dict[str, Any]]:
    """The workers' effect lines (a line cut by a SIGKILL mid-write is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def worker_counters(fleet: Fleet) -> dict[str, dict[str, float]]:
    """The library's metrics and the store's counts, summed over every incarnation.

    What a worker says about itself, written twice a second: a SIGKILLed
    process's last half second is missing. Gauges are left out.
    """
    metrics: Counter[str] = Counter()
    store: Counter[str] = Counter()
    for path in fleet.stats_paths():
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            metrics.update(
                {
                    name: value
                    for name, value in data.get("metrics", {}).items()
                    if name not in _GAUGES and not name.endswith("_age_s")
                }
            )
            store.update(data.get("store", {}))
    return {"metrics": dict(metrics), "store": dict(store)}


_GAUGES = frozenset(("in_flight", "utilization", "outbox_pending"))


def log_levels(fleet: Fleet) -> dict[str, int]:
    """Worker log lines by level; ``unstructured`` counts lines that are not JSON (tracebacks)."""
    levels: Counter[str] = Counter()
    for path in fleet.log_paths():
        for line in path.read_text(errors="replace").splitlines():
            try:
                levels[str(json.loads(line).get("level", "?"))] += 1
            except (ValueError, AttributeError):
                levels["unstructured"] += 1
    return dict(levels)


def run_events(
    injector: Injector,
    ledger: Ledger,
    workers: Mapping[str, Mapping[str, float]],
    *,
    jobs: int,
    fleet: Fleet,
    unkeyed: int,
) -> dict[str, Any]:
    """The events of the summary: faults applied, errors injected, Pub/Sub's deliveries and
    acks (from the ledger), the workers' counters (``worker_counters``), processes started."""
    deliveries = ledger.deliveries()
    metrics, store = workers["metrics"], workers["store"]
    return {
        **{fault.value: injector.counts.get(fault.value, 0) for fault in Fault},
        "skipped": dict(injector.skipped),
        "errors_injected": {
            method.rsplit("/", 1)[-1]: count for method, count in injector.pubsub_injected().items()
        },
        "deliveries": sum(deliveries.values()),
        "redeliveries": sum(n - 1 for n in deliveries.values() if n > 1),
        "redelivered_messages": sum(1 for n in deliveries.values() if n > 1),
        "pubsub": ledger.counts(),
        # Deliveries the handler was handed, beyond one per job. Most redeliveries by
        # Pub/Sub never get this far: the emulator hands a stream more than its flow
        # control asks for, and what waits there too long is given to another.
        "wrapper_redeliveries": max(int(metrics.get("received", 0)) - jobs, 0),
        "lost_ownership": int(metrics.get("lost_ownership", 0)),
        "stale_commits_rejected": int(store.get("commits_rejected", 0)),
        "claims_raced": int(store.get("claims_raced", 0)),
        "acks_lost": int(metrics.get("acks_lost", 0)),
        "worker_incarnations": sum(w.incarnation for w in fleet.workers),
        "unkeyed_outputs": unkeyed,
        "log_levels": log_levels(fleet),
    }


def _finished(
    counted: Tally,
    output_jobs: Mapping[str, str],
    outputs_seen: Mapping[str, float],
    failures_seen: Mapping[str, float],
) -> dict[str, dict[str, Any]]:
    """For the baseline, which keeps no job document: its finished jobs shaped as job
    documents, finished when their first output (or failure message) reached its consumer.

    The same notion of finished as the tally's, so that a job a killed worker held
    is unfinished (:func:`~benchmarks.chaos.verify.recoveries`) exactly when it is lost.
    """
    first: dict[str, float] = {}
    for key, at in outputs_seen.items():
        job = output_jobs.get(key, "")
        first[job] = min(at, first.get(job, at))
    docs: dict[str, dict[str, Any]] = {}
    for job in counted.completed:
        docs[job] = {"status": "completed", "completed_at": _utc(first.get(job, 0.0))}
    for job in counted.failed:
        docs[job] = {"status": "failed", "reason": "permanent"}
        docs[job]["failed_at"] = _utc(failures_seen.get(job, 0.0))
    return docs


def _utc(wall: float) -> datetime:
    return datetime.fromtimestamp(wall, timezone.utc)


def note_redeliveries(
    recoveries: Sequence[dict[str, Any]], message_of: Mapping[str, str], ledger: Ledger
) -> None:
    """Add to each kill's recovery when Pub/Sub handed each held job out again (the first
    step of a recovery): ``redelivered_after_s``, seconds after the kill and the worker."""
    for recovery in recoveries:
        recovery["redelivered_after_s"] = {
            job: [
                f"{t - recovery['at_wall']:.1f} {worker}"
                for t, worker in ledger.delivered_at(message_of.get(job, ""))
                if t > recovery["at_wall"]
            ]
            for job in recovery["jobs"]
        }


def handovers(
    begins: Sequence[tuple[str, int, float]],
    message_of: Mapping[str, str],
    ledger: Ledger,
    names: Mapping[int, str],
    *,
    since: float,
) -> dict[str, dict[str, list[str]]]:
    """For jobs run by more than one process: when each worker got it, and when each began it.

    Times in seconds after ``since`` (a wall time). The story of a recovery:
    a delivery to a worker that did not begin the job points at a stalled,
    frozen or cut-off receiver.
    """
    pids: dict[str, set[int]] = {}
    for job, pid, _ in begins:
        pids.setdefault(job, set()).add(pid)
    moved = sorted(job for job, owners in pids.items() if len(owners) > 1)
    out: dict[str, dict[str, list[str]]] = {}
    for job in moved[:MAX_HANDOVERS]:
        out[job] = {
            "delivered": [
                f"{t - since:.1f} {worker}"
                for t, worker in ledger.delivered_at(message_of.get(job, ""))
            ],
            "begun": [f"{t - since:.1f} {names.get(pid, pid)}" for j, pid, t in begins if j == job],
        }
    return out


def account(
    options: Options,
    client: Any,
    *,
    specs: Mapping[str, Mapping[str, Any]],
    published: Mapping[str, str],
    started_wall: float,
    names: Mapping[str, str],
    phases: dict[str, Any],
    ledger: Ledger,
    injector: Injector,
    fleet: Fleet,
    outputs: KeyedConsumer,
    failures: KeyedConsumer,
    left: list[str],
    logs: Path,
    subscription_note: str,
) -> dict[str, Any]:
    """Read back what one run left behind, check it, and return the run's report.

    ``published``: message id to job key. The library's run is held to every
    invariant (:func:`~benchmarks.chaos.verify.verify`); a baseline run, which
    keeps no job document, to those its effects show
    (:func:`~benchmarks.chaos.compare.baseline_checks`). Both are counted by
    :func:`~benchmarks.chaos.compare.tally` for the side-by-side table.
    """
    library = options.handler == "library"
    docs = job_documents(client, names["collection"], names["subscription"])
    writes = business_writes(client, names["sink"])
    marked = {} if library else markers(client, names["markers"])
    effects = effect_lines(logs / "effects.jsonl")
    begins = [
        (str(e["job"]), int(e["pid"]), float(e["t"])) for e in effects if e["effect"] == "begin"
    ]
    plain = Counter(str(e["job"]) for e in effects if e["effect"] == "prepare")
    copies, output_jobs, unkeyed = outputs.snapshot()
    failure_copies, _, _ = failures.snapshot()
    poison = {key: bool(spec["poison"]) for key, spec in specs.items()}
    counted = tally(
        poison=poison,
        business_writes=writes,
        output_jobs=output_jobs,
        failure_messages=failure_copies,
        records=set(docs) if library else set(marked.values()),
    )
    evidence = Evidence(
        poison=poison,
        docs=docs
        if library
        else _finished(counted, output_jobs, outputs.first_seen_at(), failures.first_seen_at()),
        business_writes=writes,
        outputs=copies,
        output_jobs=output_jobs,
        failure_messages=failure_copies,
        plain_effects=plain,
        begins=begins,
        left_unacked=left,
        timed_out=phases["drained_s"] is None,
        kills=injector.kills,
    )
    checks, figures = verify(evidence)
    if not library:
        checks = baseline_checks(counted, left)
    message_of = {key: message_id for message_id, key in published.items()}
    note_redeliveries(figures["recoveries"], message_of, ledger)
    workers = worker_counters(fleet)
    return {
        "seed": options.seed,
        "command": options.command,
        "handler": options.handler,
        "ok": all(check.ok for check in checks),
        "options": options.as_json(),
        "subscription": {
            "path": names["subscription"],
            "exactly_once": True,
            "ack_deadline_s": options.lease_s,
            "retry_policy": None,
            "why": subscription_note,
        },
        "phases": phases,
        "checks": [asdict(check) for check in checks],
        "figures": figures,
        "tally": counted.as_json(),
        "markers": len(marked),
        "events": run_events(
            injector, ledger, workers, jobs=len(specs), fleet=fleet, unkeyed=unkeyed
        ),
        "worker_metrics": workers,
        "timeline": injector.timeline,
        "handovers": handovers(begins, message_of, ledger, fleet.names(), since=started_wall),
        "logs": str(logs) if options.log_dir else None,
    }
