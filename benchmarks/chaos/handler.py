"""The chaos fleet's handler: ``pubsub-worker run benchmarks.chaos.handler:handle``.

Each job (message data: the JSON spec the orchestrator published) runs
three steps, and every effect is counted where the checker can read it:

1. ``prepare`` (``job.step``): sleeps ``prepare_ms``, then appends a line to
   the effects file, the side effect of a plain step (at least once: a
   crash between the effect and the step's commit repeats it). A poison
   job raises :class:`~pubsub_worker.PermanentError` here instead.
2. ``record`` (``job.transactional_step``): the business write, a new
   document in ``CHAOS_SINK_COLLECTION`` with an id of its own per attempt,
   so a second landing would show as a second document. Exactly once. Each
   run of the transaction's function also writes a ``record_body`` line (a
   diagnostic: a transaction may run its function more than once).
3. ``emit`` (``job.step`` + ``job.publish``): sleeps ``emit_ms``, then
   publishes the job's output to ``CHAOS_OUTPUT_TOPIC`` through the outbox.
   Exactly once end to end for a consumer keyed on the effect key.

``handle`` is already wrapped, with a job store of this module
(:class:`CountingStore`) around the library's Firestore store: it counts
the commits the store rejected (a stale owner fenced out) and, for the
must-fail run only, can switch the fence off.

Environment (besides the library's ``PUBSUB_WORKER_*``):

``CHAOS_EFFECTS``        file every effect appends one JSON line to
``CHAOS_SINK_COLLECTION`` collection of the business writes
``CHAOS_OUTPUT_TOPIC``   topic of the outputs
``CHAOS_STATS``          file this process rewrites twice a second with its counters
``CHAOS_STORE``          ``batching`` (default, the store ``exactly_once`` builds) or ``plain``
``CHAOS_RPC_TIMEOUT_S``  per-RPC timeout of the job store (default 3: a partition fails fast)
``CHAOS_UNFENCED``       ``1``: step commits ignore the version precondition (a broken
                         library, for the test that shows the run can fail); never set
                         it otherwise
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import firestore

import pubsub_worker
from pubsub_worker.errors import VersionConflict
from pubsub_worker.stores import base as store_layout
from pubsub_worker.stores.base import Changes, Snapshot, Version

__all__ = ["CountingStore", "handle", "process"]

STATS_INTERVAL_S = 0.5
_UNFENCED_ROUNDS = 5


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def effect(kind: str, job: pubsub_worker.Job, **extra: Any) -> None:
    """Append one effect line; a single ``write`` on an O_APPEND file, so lines never mix."""
    line = {
        "effect": kind,
        "job": job.key,
        "epoch": job.epoch,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    fd = os.open(_env("CHAOS_EFFECTS"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


class CountingStore:
    """A :class:`~pubsub_worker.stores.transactions.TransactionalStore` around the Firestore store.

    Built lazily, on the first call, from the settings of the environment
    (nothing is read at import time). Counts conditional commits the store
    rejected with :class:`~pubsub_worker.errors.VersionConflict` (claims,
    the writes that move the epoch, are counted apart). With ``unfenced`` a
    commit that is not a claim and fails its version precondition is sent
    again on the document's current version, until it lands: the fence is
    gone, which is what the must-fail run needs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _inner and counts
        self._inner: pubsub_worker.FirestoreJobStore | None = None
        self.counts: Counter[str] = Counter()
        self.unfenced = False

    @property
    def inner(self) -> pubsub_worker.FirestoreJobStore:
        """The library's store (built on first use)."""
        with self._lock:
            if self._inner is None:
                self._inner = self._build()
            return self._inner

    @property
    def client(self) -> firestore.Client:
        """The Firestore client of the store (for the business write's document)."""
        return self.inner.client

    def _build(self) -> pubsub_worker.FirestoreJobStore:
        settings = pubsub_worker.Settings.from_env()
        client = firestore.Client(project=settings.project_id)
        timeout_s = float(_env("CHAOS_RPC_TIMEOUT_S", "3"))
        kind = _env("CHAOS_STORE", "batching")
        store_class: type[pubsub_worker.FirestoreJobStore] = {
            "batching": pubsub_worker.BatchingFirestoreJobStore,
            "plain": pubsub_worker.FirestoreJobStore,
        }[kind]
        self.unfenced = _env("CHAOS_UNFENCED") == "1"
        _Stats.start(self)
        return store_class(client, settings.collection, rpc_timeout_s=timeout_s)

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    # -- JobStore ---------------------------------------------------------------------

    def get(self, doc_id: str) -> Snapshot | None:
        return self.inner.get(doc_id)

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        return self.inner.create(doc_id, fields)

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        claim = (store_layout.EPOCH,) in changes
        for _ in range(_UNFENCED_ROUNDS):
            try:
                return self.inner.update(doc_id, changes, expected=expected)
            except VersionConflict:
                if claim or not self.unfenced:
                    self._count("claims_raced" if claim else "commits_rejected")
                    raise
                expected = self._current(doc_id, expected)  # no fence: write over it
        raise VersionConflict(doc_id)

    def transact(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Any],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        for _ in range(_UNFENCED_ROUNDS):
            try:
                return self.inner.transact(doc_id, expected=expected, body=body, changes=changes)
            except VersionConflict:
                if not self.unfenced:
                    self._count("commits_rejected")
                    raise
                expected = self._current(doc_id, expected)
        raise VersionConflict(doc_id)

    def _current(self, doc_id: str, expected: Version) -> Version:
        """The document's version now (the unfenced store writes over whatever is there)."""
        snap = self.inner.get(doc_id)
        return snap.version if snap is not None else expected


STORE = CountingStore()


def process(message: Any, job: pubsub_worker.Job) -> None:
    """One job: a plain step, a transactional business write, an output through the outbox."""
    spec = json.loads(message.data)
    effect("begin", job, attempt=job.attempt)

    def prepare() -> int:
        if spec.get("poison"):
            raise pubsub_worker.PermanentError("a poison job: it can never succeed")
        time.sleep(spec["prepare_ms"] / 1000)
        effect("prepare", job)
        return os.getpid()

    def record(transaction: Any) -> str:
        effect("record_body", job)  # a count of attempts: only the one that commits is a write
        ref = STORE.client.collection(_env("CHAOS_SINK_COLLECTION")).document()
        transaction.set(ref, {"job": job.key, "epoch": job.epoch, "pid": os.getpid()})
        return str(ref.id)

    def emit() -> str:
        time.sleep(spec["emit_ms"] / 1000)
        job.publish(_env("CHAOS_OUTPUT_TOPIC"), f"output of {job.key}".encode(), job=job.key)
        return "emitted"

    job.step("prepare", prepare)
    job.transactional_step("record", record)
    job.step("emit", emit)


handle = pubsub_worker.exactly_once(process, store=STORE)
"""The wrapped handler the fleet runs."""


class _Stats:
    """Rewrites ``CHAOS_STATS`` with this process's counters, twice a second and at exit.

    A SIGKILLed worker loses at most the last half second of counts.
    """

    _started = False

    @classmethod
    def start(cls, store: CountingStore) -> None:
        path = _env("CHAOS_STATS")
        if cls._started or not path:
            return
        cls._started = True
        stop = threading.Event()

        def dump() -> None:
            try:
                metrics = handle.metrics.snapshot()
            except Exception:  # noqa: BLE001 - not started yet: nothing to count
                metrics = {}
            with store._lock:
                counts = dict(store.counts)
            data = {"pid": os.getpid(), "metrics": metrics, "store": counts, "t": time.time()}
            temporary = f"{path}.tmp"
            with open(temporary, "w") as fh:
                json.dump(data, fh)
            os.replace(temporary, path)

        def loop() -> None:
            while not stop.wait(STATS_INTERVAL_S):
                dump()

        threading.Thread(target=loop, name="chaos-stats", daemon=True).start()

        def final() -> None:
            stop.set()
            dump()

        atexit.register(final)
