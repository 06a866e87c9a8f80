"""The dashboard on a big collection: each page's server answer, timed on the emulators.

``python -m benchmarks.ui --jobs 100000`` starts the Pub/Sub and Firestore
emulators, writes ``--jobs`` job documents in the stored layout (batches of
500, with progress: :func:`benchmarks.ui_support.seed_jobs`), serves
``pubsub-worker ui --allow-actions`` in this process and asks each page
``--repeat`` times after one warm-up (none with ``--no-warmup``), over HTTP,
printing the median and the slowest answer. Every page answers from indexed queries with paging: the
counts are ``count()`` aggregations, the lists one page of the listing's
query, a key prefix at most 2,000 documents, a replay's dry run the 500
newest of a group.

The Firestore emulator answers queries and aggregations by reading its
documents (it has no indexes), so its times grow with the collection where
real Firestore's do not; they show where the dashboard's own time goes, not
what production answers. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

import google.cloud.pubsub_v1 as pubsub_v1
import httpx
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

import pubsub_worker
from benchmarks.ui_support import seed_jobs, serving
from emulator import start_emulators
from pubsub_worker._job.keys import document_id
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Status
from pubsub_worker.ui import Jobs, create_app

__all__ = ["main", "pages"]

PROJECT = "ui-bench"
COLLECTION = "pubsub_worker_jobs"


def pages(subscription: str, sample_doc: str) -> dict[str, str]:
    """What is asked: each page of the dashboard, and the parts it refreshes."""
    sub = quote(subscription, safe="")
    return {
        "overview": "/",
        "overview: counts part": f"/parts/counts?sub={sub}",
        "overview: running part": f"/parts/running?sub={sub}",
        "job list": f"/jobs?sub={sub}",
        "job list, failed": f"/jobs?sub={sub}&status=failed",
        "job list, failed, reason": f"/jobs?sub={sub}&status=failed&reason=too_large",
        "job list, last week's first day": f"/jobs?sub={sub}&until=" + _days_ago(6),
        "job list, key prefix (rare)": f"/jobs?sub={sub}&prefix=op-00999",
        "job page": f"/jobs/{sample_doc}",
        "review queue": f"/review?sub={sub}",
        "replay dry run (500 newest)": f"/review/replay?sub={sub}&reason=attempts",
    }


def emulator_costs(client: Any, subscription: str) -> None:
    """One count and one listing page, each with the listing's shard filter and without it.

    The Firestore emulator keeps no index: it answers each query by reading the
    collection, and an ``in`` filter as one such read per value. Real Firestore
    answers all four from an index, reading only the entries that match.
    """
    jobs = client.collection(COLLECTION)
    running = jobs.where(filter=FieldFilter(s.SUBSCRIPTION, "==", subscription)).where(
        filter=FieldFilter(s.STATUS, "==", Status.RUNNING.value)
    )
    sharded = running.where(filter=FieldFilter(s.SHARD, "in", list(range(s.SHARDS))))

    def page(query: Any) -> int:
        ordered = query.order_by(s.UPDATED_AT, direction="DESCENDING")
        return len(list(ordered.order_by("__name__", direction="DESCENDING").limit(21).stream()))

    asked: dict[str, Callable[[], Any]] = {
        "count() of the running jobs, shard in [0..15]": lambda: sharded.count().get()[0][0].value,
        "count() of the running jobs, no shard filter": lambda: running.count().get()[0][0].value,
        "21 newest running jobs, shard in [0..15]": lambda: page(sharded),
        "21 newest running jobs, no shard filter": lambda: page(running),
    }
    for name, ask in asked.items():
        begun = time.perf_counter()
        answer = int(ask())
        print(f"  {name:<48} {(time.perf_counter() - begun) * 1000:8.0f} ms  ({answer:,})")


def _days_ago(days: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - days * 86400))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ui", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000, help="job documents to seed")
    parser.add_argument("--repeat", type=int, default=5, help="timed answers per page")
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="time each page's first answer too (at 100,000 jobs the emulator's scans, "
        "not a cold start, are what a page waits for)",
    )
    parser.add_argument(
        "--emulator-costs",
        action="store_true",
        help="before the pages, time one count and one listing page with and without the "
        "shard filter: what the emulator's lack of indexes costs each query",
    )
    args = parser.parse_args(argv)
    print(f"starting the emulators; seeding {args.jobs:,} jobs", flush=True)
    with start_emulators(PROJECT) as emu:
        emu.export_env()
        publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()
        topic = publisher.create_topic(name=f"projects/{PROJECT}/topics/orders").name
        subscription = subscriber.create_subscription(
            request={"name": f"projects/{PROJECT}/subscriptions/orders-worker", "topic": topic}
        ).name
        client = firestore.Client(project=PROJECT)
        started = time.perf_counter()
        seed_jobs(client, COLLECTION, subscription, args.jobs)
        seeded_s = time.perf_counter() - started
        print(f"seeded in {seeded_s:.0f} s ({args.jobs / seeded_s:,.0f} documents/s)")
        if args.emulator_costs:
            emulator_costs(client, subscription)
        settings = pubsub_worker.Settings(subscription=subscription, collection=COLLECTION)
        jobs = Jobs(settings, client=client)
        sample = document_id(subscription, "op-0000042")
        rows = []
        app = create_app(jobs, allow_actions=True)
        with serving(app) as url, httpx.Client(base_url=url, timeout=3600) as http:
            for name, path in pages(subscription, sample).items():
                if not args.no_warmup:
                    answer = http.get(path)
                    if answer.status_code != 200:
                        print(f"{name}: HTTP {answer.status_code}", file=sys.stderr)
                        return 1
                times = []
                for _ in range(args.repeat):
                    begun = time.perf_counter()
                    http.get(path).raise_for_status()
                    times.append((time.perf_counter() - begun) * 1000)
                rows.append((name, statistics.median(times), max(times)))
                load = os.getloadavg()[0]
                print(
                    f"  {name:<34} median {rows[-1][1]:8.0f} ms  max {rows[-1][2]:8.0f} ms"
                    f"  (load average {load:.1f})",
                    flush=True,
                )
        jobs.close()
        subscriber.close()
    print()
    print(f"| page ({args.jobs:,} jobs, Firestore emulator) | median ms | slowest ms |")
    print("| --- | ---: | ---: |")
    for name, median, slowest in rows:
        print(f"| {name} | {median:,.0f} | {slowest:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
