"""A lone message's own time, split: in one process, on the Firestore emulator, no Pub/Sub.

``python -m benchmarks.lone`` wraps a one-step handler with
:func:`pubsub_worker.exactly_once` on the default (batching) Firestore store
and hands it ``--messages`` fake messages one at a time, ``--gap-ms`` apart
(a lone message finds the process idle), each concluded and acked on its
own callback thread: no completer, no Pub/Sub client, no hand-off between
threads. Per message it times, on the callback thread:

- the callback, from its start to its return (the ack given);
- the ``BatchWrite`` RPCs, from the call to its answer (what the benchmark
  run's ``lone: own ms`` takes out as Firestore's);
- the store's calls (``create``, ``update``, and ``update_then`` less the
  conclusion it carries on with) around them.

So ``own`` (callback less RPCs) splits into the store's own work around each
RPC (building, sizing and settling each write, the request and its answer)
and the wrapper's work outside the store (receipt, identity, claim, step,
outcome, ack). With no thread hand-off in the path, ``own`` is CPU on the
callback thread, which ``thread CPU`` (everything, the RPCs' client side
included) bounds from above.

Starts its own Firestore emulator unless ``FIRESTORE_EMULATOR_HOST`` is set.
Nothing here is a test or a target; the benchmark run
(:mod:`benchmarks.run`) is where figures against the stock client come from.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pubsub_worker
from benchmarks.inprocess import _handler, _Message, _publish, firestore_client
from pubsub_worker.stores.batching import BatchingFirestoreJobStore

__all__ = ["LoneTimes", "main", "measure"]


@dataclass(frozen=True)
class LoneTimes:
    """Medians over the measured messages, in milliseconds."""

    messages: int
    callback: float
    rpc: float
    store: float
    own: float
    store_own: float
    """The store's calls less their RPCs."""
    wrapper_own: float
    """The callback less the store's calls."""
    thread_cpu: float


class _Timer:
    """Wall time spent inside wrapped callables, reset per message."""

    def __init__(self) -> None:
        self.spent = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - started

        return timed

    def wrap_continued(self, fn: Callable[..., None]) -> Callable[..., None]:
        """``update_then``: its time less that of the continuation it calls (the wrapper's)."""

        def timed(*args: Any, then: Callable[..., None], **kwargs: Any) -> None:
            started, carried_on = time.perf_counter(), 0.0

            def continued(*outcome: Any) -> None:
                nonlocal carried_on
                began = time.perf_counter()
                try:
                    then(*outcome)
                finally:
                    carried_on += time.perf_counter() - began

            try:
                fn(*args, then=continued, **kwargs)
            finally:
                self.spent += time.perf_counter() - started - carried_on

        return timed


def measure(client: Any, *, messages: int, warmup: int, gap_s: float) -> LoneTimes:
    """Time ``messages`` lone one-step messages after ``warmup`` unmeasured ones."""
    store = BatchingFirestoreJobStore(client, f"lone-{uuid.uuid4().hex[:8]}")
    rpc, calls = _Timer(), _Timer()
    store.batcher._call = rpc.wrap(store.batcher._call)
    store.create = calls.wrap(store.create)  # type: ignore[method-assign]
    store.update = calls.wrap(store.update)  # type: ignore[method-assign]
    store.update_then = calls.wrap_continued(store.update_then)  # type: ignore[method-assign]
    wrapped = pubsub_worker.exactly_once(
        _handler,
        settings=pubsub_worker.Settings(
            subscription="projects/bench/subscriptions/lone", key_attribute="op", lease_seconds=60
        ),
        store=store,
        publisher=_publish,
    )
    wrapped.start(check_subscription=False)
    rows: list[tuple[float, float, float, float]] = []
    run = uuid.uuid4().hex[:8]
    try:
        for n in range(warmup + messages):
            message = _Message(n)
            message.attributes = {"op": f"{run}-{n}"}
            message.message_id = f"{run}-{n}"
            time.sleep(gap_s)
            rpc.spent = calls.spent = 0.0
            cpu, started = time.thread_time(), time.perf_counter()
            wrapped(message)
            wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
            if not message.acked:
                raise AssertionError(f"message {message.message_id} was not acked")
            if n >= warmup:
                rows.append((wall, rpc.spent, calls.spent, cpu))
    finally:
        wrapped.close()
        store.close()

    def median(values: Sequence[float]) -> float:
        return statistics.median(values) * 1000

    return LoneTimes(
        messages=len(rows),
        callback=median([r[0] for r in rows]),
        rpc=median([r[1] for r in rows]),
        store=median([r[2] for r in rows]),
        own=median([r[0] - r[1] for r in rows]),
        store_own=median([r[2] - r[1] for r in rows]),
        wrapper_own=median([r[0] - r[2] for r in rows]),
        thread_cpu=median([r[3] for r in rows]),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lone", description=__doc__)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.getLogger("pubsub_worker").setLevel(logging.WARNING)
    with firestore_client() as client:
        for n in range(args.repeats):
            t = measure(
                client, messages=args.messages, warmup=args.warmup, gap_s=args.gap_ms / 1000
            )
            print(
                f"[{n + 1}/{args.repeats}] {t.messages} lone one-step messages, medians: "
                f"callback {t.callback:.2f} ms, BatchWrite RPCs {t.rpc:.2f}, own {t.own:.2f} "
                f"(the store around its RPCs {t.store_own:.2f}, the wrapper outside the store "
                f"{t.wrapper_own:.2f}); callback thread CPU {t.thread_cpu:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
