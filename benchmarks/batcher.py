"""The batching store under concurrent writers, in one process on the Firestore emulator.

``python -m benchmarks.batcher`` starts ``--threads`` (10) writing threads,
each making the writes of one-step jobs as the wrapper makes them, one job
after another for ``--seconds``: create the job's document, then update it
against the version the create returned. No Pub/Sub, no wrapper: only
:class:`~pubsub_worker.stores.batching.BatchingFirestoreJobStore` and its
:class:`~pubsub_worker.stores._batcher.WriteBatcher`. Per job it reports
the process's CPU, the ``BatchWrite`` RPCs and the context switches by thread
role (:mod:`benchmarks.threads`: the writing threads count as callbacks, the
batcher's flushers as writers, gRPC's C-core threads as grpc): each switch is
a wake-up, and a hand-off between threads costs one or two.

It is the A/B tool for changes to the batcher: run it on the code before and
after, alternately, and compare the later repeats (the first ones warm the
emulator up). Starts its own Firestore emulator unless
``FIRESTORE_EMULATOR_HOST`` is set. Nothing here is a test or a target; the
benchmark run (:mod:`benchmarks.run`) is where figures against the stock
client come from.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.inprocess import firestore_client
from benchmarks.threads import thread_switches
from pubsub_worker.stores.batching import BatchingFirestoreJobStore

__all__ = ["BatcherLoad", "main", "measure"]


@dataclass(frozen=True)
class BatcherLoad:
    """One repeat's figures, per job (two writes)."""

    jobs: int
    jobs_per_s: float
    cpu_ms: float
    rpcs: float
    switches: dict[str, float]
    """By thread role, roles with none left out."""


def measure(store: BatchingFirestoreJobStore, *, threads: int, seconds: float) -> BatcherLoad:
    """Run ``threads`` writing threads for ``seconds``; the figures per job.

    The threads stay alive until the switches are read (an ended thread's
    count is no longer its role's).
    """
    stop_at = time.monotonic() + seconds
    finished, read = threading.Barrier(threads + 1), threading.Event()
    counts = [0] * threads
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            while time.monotonic() < stop_at:
                doc = uuid.uuid4().hex
                version = store.create(doc, {"epoch": 1})
                store.update(doc, {("state",): "done"}, expected=version)
                counts[index] += 1
        except BaseException as exc:  # reported by the caller  # noqa: BLE001
            errors.append(exc)
        finally:
            finished.wait()
            read.wait()

    workers = [
        threading.Thread(target=write, args=(n,), name=f"bench_{n}", daemon=True)
        for n in range(threads)
    ]
    batches = store.batcher.batches
    switched, cpu, started = thread_switches(), time.process_time(), time.perf_counter()
    for worker in workers:
        worker.start()
    finished.wait()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    switches = {role: count - switched.get(role, 0) for role, count in thread_switches().items()}
    read.set()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    jobs = sum(counts)
    if not jobs:
        raise RuntimeError("no job's writes finished: is the emulator answering?")
    return BatcherLoad(
        jobs=jobs,
        jobs_per_s=jobs / elapsed,
        cpu_ms=cpu / jobs * 1000,
        rpcs=(store.batcher.batches - batches) / jobs,
        switches={role: count / jobs for role, count in switches.items() if count > 0},
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batcher", description=__doc__)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with firestore_client() as client:
        store = BatchingFirestoreJobStore(client, f"batcher-{uuid.uuid4().hex[:8]}")
        try:
            for n in range(args.repeats):
                load = measure(store, threads=args.threads, seconds=args.seconds)
                print(
                    f"[{n + 1}/{args.repeats}] {load.jobs} jobs, {args.threads} threads: "
                    f"{load.jobs_per_s:,.0f} jobs/s, CPU {load.cpu_ms:.3f} ms/job, "
                    f"{load.rpcs:.2f} BatchWrite RPCs/job, switches/job "
                    + ", ".join(f"{role} {count:.2f}" for role, count in load.switches.items()),
                    flush=True,
                )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
