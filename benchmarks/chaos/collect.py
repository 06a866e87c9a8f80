"""Reading back what a run left behind: documents, messages, effect lines, counters, logs.

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
from pathlib import Path
from typing import Any

from google.api_core import exceptions as gexc

from benchmarks.chaos.feeder import KEY_ATTRIBUTE
from benchmarks.chaos.fleet import Fleet
from benchmarks.chaos.ledger import Ledger

__all__ = [
    "business_writes",
    "effect_lines",
    "handovers",
    "job_documents",
    "left_unacked",
    "log_levels",
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
    push = {"push_endpoint": "http://127.0.0.1:9/stale-stream-reaper"}
    for config in (push, {}):
        subscriber.modify_push_config(
            request={"subscription": subscription, "push_config": config}, timeout=10
        )
        time.sleep(0.2)
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
