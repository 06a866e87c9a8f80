"""The store contract as a state machine: the protocol's own code, in random orders, on every store.

Random sequences of claims (two or three owners; a redelivery, or another
message with the same key, or one with another payload), steps with their
results (plain, publishing through the outbox, or transactional with a
business write), a delivery's one conclusion (completion, retry, release on
shutdown, failure), the operator's ``jobs release`` and ``replay``, with
Pub/Sub taking or refusing each step's publishes, all through the library's
functions:
:func:`~pubsub_worker._job.claim.claim`, the claimed job's
:class:`~pubsub_worker._job.core.JobCore` (whose writes are its
:class:`~pubsub_worker._job.fencing.FencedDocument`'s),
:func:`pubsub_worker._ops.jobs.release` and :func:`pubsub_worker._ops.replay.replay`.

After every step, on every store: at most one completion per job, and a
completed job never changes again; no write lands unless, just before it,
the job was running at the writer's epoch and delivery (a stale owner's
commit never lands); a step's record, once written, is never overwritten
(another epoch's result included), and a transactional step's business
write exists exactly when its record does, from the same run; a job in the
failure path was never completed and a completed one has no outbox entry
unsent; epochs only grow (every claim, release by the operator and replay
adds one); a document's versions never repeat.

Two tests. On the memory store alone, with its clock moved by hand, leases
lapse by time. In lockstep on the memory store, Firestore and the batching
Firestore store (the emulator), every operation must also give the same
answer on each and leave the same documents and the same published
messages; the emulator's clock cannot be moved, so there a claim's lease
is either 0 s (lapsed at once: an owner that stalled) or 600 s (live
throughout the example), and the operator's release ends live ones.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from emulator.names import unique_id
from pubsub_worker._delivery.generations import Delivery, DeliveryTracker
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.context import JobContext
from pubsub_worker._job.core import JobCore
from pubsub_worker._job.keys import derive_identity, document_id
from pubsub_worker._ops import jobs
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, replay
from pubsub_worker._support.logs import job_logger
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.errors import LostOwnership, OutboxUnsent
from pubsub_worker.hooks import Hooks
from pubsub_worker.stores import BatchingFirestoreJobStore, FirestoreJobStore, MemoryJobStore
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import JobRecord, JobStore, Snapshot, Status

_LOGGER = logging.getLogger(__name__)
OWNERS = ("host/1/a", "host/2/b", "host/3/c")
KEYS = ("k1", "k2")
TOPIC = "projects/p/topics/jobs"
PAYLOAD = b"payload"
RETENTION_S = 3600.0
RENEWAL_S = 600.0
"""The lease the jobs renew by: longer than an example, so a step's record is committed
lazily (with the next write) on every store alike, whatever the machine's speed."""
METRICS = Metrics()
PUBSUB = st.sampled_from(["up", "down"])
"""Whether Pub/Sub takes the publishes of a step (outbox entries, a replay's message)."""


class Clock:
    """The memory store's clock (the server's), moved by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


@dataclass
class World:
    """One store under test, what the jobs need around it, and what its history showed."""

    store: JobStore
    published: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)
    cores: dict[int, JobCore] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    versions: dict[str, list[object]] = field(default_factory=dict)
    steps: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    completed: dict[str, tuple[int, object]] = field(default_factory=dict)
    completions: dict[str, int] = field(default_factory=dict)
    in_review: set[str] = field(default_factory=set)
    """Keys whose job was seen failed and not replayed since: only a replay revives one."""
    pubsub_down: bool = False

    def publish(self, topic: str, data: bytes, attributes: Any) -> Future[str]:
        future: Future[str] = Future()
        if self.pubsub_down:
            future.set_exception(ConnectionError("Pub/Sub is unreachable"))
            return future
        self.published.append((topic, data, dict(attributes)))
        future.set_result(str(len(self.published)))
        return future

    def business_write(self, transaction: Any, doc_id: str, fields: dict[str, Any]) -> None:
        """What a transactional step's function writes, through its transaction."""
        if isinstance(self.store, FirestoreJobStore):
            transaction.set(self.store.ref(doc_id), fields)
        else:
            transaction.set(doc_id, fields)


@dataclass(frozen=True)
class Handle:
    """One successful claim: the same job core on every store."""

    id: int
    owner: str
    key: str
    epoch: int
    delivery: Delivery


def record_of(snap: Snapshot | None) -> JobRecord:
    return JobRecord.parse(snap.fields if snap is not None else {})


def normalized(value: Any) -> Any:
    """A document as the stores must agree on it: times as a mark, the store's write id gone."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if k != s.WRITE_ID}
    if isinstance(value, datetime):
        return "<time>"
    return value


def outcome_of(call: Callable[[], Any]) -> Any:
    """The call's result, or the name of the refusal a stale or finished owner gets (or of an
    outbox entry that could not be published)."""
    try:
        return ("ok", call())
    except (LostOwnership, OutboxUnsent, RuntimeError) as exc:
        return type(exc).__name__


class StoreMachine(RuleBasedStateMachine):
    """The job protocol on one or more stores; subclasses say which and how leases lapse."""

    leases: ClassVar[dict[str, float]] = {"lapsed": 0.0, "live": 600.0}
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.clock: Clock | None = None
        self.worlds = [World(store) for store in self.stores()]
        self.sub = f"projects/p/subscriptions/{unique_id('model')}"
        self.trackers = {owner: DeliveryTracker() for owner in OWNERS}
        self.counter = itertools.count(1)
        self.stopping = threading.Event()
        self.claimed: set[str] = set()

    def stores(self) -> list[JobStore]:
        raise NotImplementedError

    # -- helpers -------------------------------------------------------------------------

    def weather(self, pubsub: str) -> None:
        """Pub/Sub takes publishes (``up``) or refuses them all (``down``) during this step."""
        for world in self.worlds:
            world.pubsub_down = pubsub == "down"

    def doc_id(self, key: str) -> str:
        return document_id(self.sub, key)

    def effect_id(self, key: str, step: str) -> str:
        return f"effect-{self.doc_id(key)[:24]}-{step}"

    def context(self, world: World, owner: str) -> JobContext:
        return JobContext(
            store=world.store,
            tracker=self.trackers[owner],
            metrics=METRICS,
            publish=world.publish,
            topic_path=lambda topic: f"projects/p/topics/{topic}",
            lease_s=RENEWAL_S,
            retention_s=RETENTION_S,
            io_timeout_s=10.0,
            outbox_key_attribute="effect_key",
            stopping=self.stopping,
            hooks=Hooks(),
        )

    @staticmethod
    def agree(what: str, answers: list[Any]) -> None:
        assert all(a == answers[0] for a in answers), f"{what}: the stores answered {answers}"

    def as_owner(self, handle: Handle, what: str, act: Callable[[World, JobCore], Any]) -> None:
        """``act`` on each store's core of ``handle``; a write lands only at its own epoch."""
        answers = []
        for world in self.worlds:
            doc_id = self.doc_id(handle.key)
            before = world.store.get(doc_id)
            answers.append(outcome_of(partial(act, world, world.cores[handle.id])))
            after = world.store.get(doc_id)
            assert before is not None
            assert after is not None
            if after.version != before.version:
                was, now = record_of(before), record_of(after)
                assert (was.status, was.epoch, was.delivery) == (
                    Status.RUNNING,
                    handle.epoch,
                    handle.delivery.digest,
                ), f"{what} by the owner at epoch {handle.epoch} landed on {was}"
                assert now.epoch == handle.epoch
        self.agree(what, answers)

    # -- the owners' side ----------------------------------------------------------------

    @initialize(
        target=handles, owner=st.sampled_from(OWNERS), lease=st.sampled_from(["lapsed", "live"])
    )
    def first_claim(self, owner: str, lease: str) -> Any:
        """Every example starts with a job to work on."""
        return self.claim(owner, KEYS[0], lease, "redelivery", exists_hint=False)

    @rule(
        target=handles,
        owner=st.sampled_from(OWNERS),
        key=st.sampled_from(KEYS),
        lease=st.sampled_from(["lapsed", "live", "live"]),
        message=st.sampled_from(["redelivery"] * 3 + ["another"] * 2 + ["other payload"]),
        exists_hint=st.booleans(),
        pubsub=PUBSUB,
    )
    def claim(
        self, owner: str, key: str, lease: str, message: str, exists_hint: bool, pubsub: str = "up"
    ) -> Any:
        self.weather(pubsub)
        n = next(self.counter)
        message_id = f"m-{key}" if message == "redelivery" else f"m-{key}-{n}"
        tracker = self.trackers[owner]
        delivery = tracker.register(message_id, f"ack-{n}")  # supersedes its earlier one here
        identity = derive_identity(
            subscription=self.sub,
            message_id=message_id,
            attributes={"op": key},
            data=b"other" if message == "other payload" else PAYLOAD,
            key_attribute="op",
        )
        request = ClaimRequest(
            identity=identity,
            owner=owner,
            message_id=message_id,
            delivery=delivery.digest,
            lease_s=self.leases[lease],
            retention_s=RETENTION_S,
            abandoned=tracker.abandoned,
        )
        self.claimed.add(key)
        claims = []
        for world in self.worlds:
            before = world.store.get(identity.doc_id)
            got = claim(world.store, request, exists_hint=exists_hint)
            after = world.store.get(identity.doc_id)
            assert after is not None
            if got.kind is ClaimKind.CLAIMED:
                now = record_of(after)
                assert (now.status, now.owner, now.delivery) == (
                    Status.RUNNING,
                    owner,
                    delivery.digest,
                )
                assert now.epoch == got.epoch == record_of(before).epoch + 1, "a claim adds one"
                assert after.version == got.version
            else:
                assert before is not None
                assert after.version == before.version  # a refused claim writes nothing
            claims.append(got)
        self.agree("claim", [(c.kind, c.record and c.record.attempts) for c in claims])
        if claims[0].kind is not ClaimKind.CLAIMED:
            return multiple()
        handle = Handle(n, owner, key, claims[0].epoch, delivery)
        answers = []
        for world, got in zip(self.worlds, claims, strict=True):
            assert got.record is not None
            assert got.version is not None
            core = JobCore(
                identity=identity,
                delivery=delivery,
                record=got.record,
                version=got.version,
                context=self.context(world, owner),
                log=job_logger(_LOGGER, key, message_id),
            )
            world.cores[handle.id] = core
            # Earlier owners' committed entries go out before the handler runs, as the worker does.
            answers.append(outcome_of(core.publish_unsent))
        self.agree("publish unsent", answers)
        return handle

    @rule(
        handle=handles,
        name=st.sampled_from(["s0", "s1", "s2", "t0", "t1"]),
        value=st.integers(0, 9),
        publishes=st.booleans(),
        pubsub=PUBSUB,
    )
    def step(self, handle: Handle, name: str, value: int, publishes: bool, pubsub: str) -> None:
        """A step (``s*``), or a transactional step (``t*``) with its business write."""
        self.weather(pubsub)
        result = {"by": handle.owner, "epoch": handle.epoch, "v": value}
        effect = self.effect_id(handle.key, name)

        def act(world: World, core: JobCore) -> Any:
            def body(transaction: Any = None) -> dict[str, Any]:
                if publishes:
                    core.publish("out", name.encode(), {"n": str(value)})
                if transaction is not None:
                    world.business_write(transaction, effect, result)
                return result

            if name.startswith("s"):
                return core.run_step(name, body)
            return core.run_transactional(name, body)

        self.as_owner(handle, "step", act)
        if name.startswith("s"):
            return
        for world in self.worlds:  # the business write and the record: together or neither
            record = record_of(world.store.get(self.doc_id(handle.key))).steps.get(name)
            written = world.store.get(effect)
            if record is None:
                assert written is None, f"{name}'s business write landed without its record"
            else:
                assert written is not None, f"{name}'s record landed without its business write"
                assert normalized(written.fields) == json.loads(record.result)

    @rule(
        handle=consumes(handles),  # a delivery concludes once (the flow's lock decides)
        how=st.sampled_from(["complete", "retry", "release", "fail", "fail"]),
        pubsub=PUBSUB,
    )
    def conclude(self, handle: Handle, how: str, pubsub: str) -> None:
        """The handler returned (complete), failed (retry: the attempt counted), was stopped
        by a shutdown (release: the attempt given back), or the job goes to review (fail)."""
        self.weather(pubsub)
        extra = {s.DATA: PAYLOAD, s.ATTRIBUTES: json.dumps({"op": handle.key})}

        def act(world: World, core: JobCore) -> None:
            core.handler_returned()
            if how == "complete":
                core.complete()
                world.completions[handle.key] = world.completions.get(handle.key, 0) + 1
            elif how == "fail":
                core.fail("attempts", "gave up", extra)
            else:
                core.release("the attempt failed", count_attempt=how == "retry")

        self.as_owner(handle, how, act)

    # -- the operator's side -------------------------------------------------------------

    def known_key(self, n: int) -> str:
        """One of the keys claimed so far: the operator works on jobs that exist."""
        known = [key for key in KEYS if key in self.claimed]
        return known[n % len(known)]

    @rule(n=st.integers(0, 1), seen=st.sampled_from(["unfenced", "current", "stale"]))
    def operator_release(self, n: int, seen: str) -> None:
        key = self.known_key(n)
        answers = []
        for world in self.worlds:
            before = world.store.get(self.doc_id(key))
            epoch = record_of(before).epoch
            expect = {"unfenced": None, "current": epoch, "stale": epoch - 1}[seen]
            result = jobs.release(world.store, self.sub, key, expect_epoch=expect)
            after = world.store.get(self.doc_id(key))
            if result.kind is jobs.ReleaseOutcome.RELEASED:
                self.check_reset(before, after, status=Status.RELEASED)
            else:
                assert (after and after.version) == (before and before.version)
            answers.append((result.kind, result.epoch))
        self.agree("jobs release", answers)

    @rule(n=st.integers(0, 1), pubsub=PUBSUB)
    def replay(self, n: int, pubsub: str) -> None:
        self.weather(pubsub)
        key = self.known_key(n)
        answers = []
        for world in self.worlds:
            before = world.store.get(self.doc_id(key))
            sent = len(world.published)
            job = FailedJob(self.doc_id(key), record_of(before))
            [result] = replay(
                world.store, [job], topic=TOPIC, publish=world.publish, key_attribute="op"
            )
            after = world.store.get(self.doc_id(key))
            if result.kind in (ReplayOutcome.REPLAYED, ReplayOutcome.FAILED):
                world.in_review.discard(key)
                self.check_reset(before, after, status=Status.RELEASED)
                assert record_of(after).attempts == 0
                republished = [(TOPIC, PAYLOAD, {"op": key})]
                assert world.published[sent:] == (
                    republished if result.kind is ReplayOutcome.REPLAYED else []
                )
            else:
                assert (after and after.version) == (before and before.version)
                assert len(world.published) == sent
            answers.append((result.kind, (result.reason or "").split(" (")[0]))
        self.agree("replay", answers)

    @staticmethod
    def check_reset(before: Snapshot | None, after: Snapshot | None, *, status: Status) -> None:
        """An operator's reset: one epoch more, the steps and the outbox kept."""
        was, now = record_of(before), record_of(after)
        assert now.status is status
        assert now.epoch == was.epoch + 1, "an operator's reset adds one to the epoch"
        assert (now.steps, now.outbox) == (was.steps, was.outbox), "a reset keeps the steps"

    # -- time ------------------------------------------------------------------------------

    @precondition(lambda self: self.clock is not None)  # the memory store's clock only
    @rule(seconds=st.sampled_from([1, 4, 11, 61]))
    def time_passes(self, seconds: int) -> None:
        assert self.clock is not None
        self.clock.now += timedelta(seconds=seconds)

    # -- what must hold after every step -------------------------------------------------

    @invariant()
    def the_contract_holds_and_the_stores_agree(self) -> None:
        views = []
        for world in self.worlds:
            docs = {}
            for key in KEYS:
                snap = world.store.get(self.doc_id(key))
                if snap is not None:
                    self.check_history(world, key, snap)
                docs[key] = normalized(snap.fields) if snap is not None else None
            views.append((docs, world.published))
        self.agree("the documents and the messages published", views)

    @staticmethod
    def check_history(world: World, key: str, snap: Snapshot) -> None:
        record = record_of(snap)
        assert record.epoch >= world.epochs.get(key, 0), "the epoch went back"
        world.epochs[key] = record.epoch
        seen = world.versions.setdefault(key, [])
        if not seen or seen[-1] != snap.version:
            assert snap.version not in seen, f"version {snap.version!r} came back"
            seen.append(snap.version)
        for name, step in record.steps.items():
            assert step.epoch <= record.epoch
            first = world.steps.setdefault((key, name), (step.result, step.epoch))
            assert (step.result, step.epoch) == first, f"step {name}'s record was overwritten"
        for done_key, name in world.steps:
            assert done_key != key or name in record.steps, f"step {name}'s record vanished"
        completed_at = snap.fields.get(s.COMPLETED_AT)
        if key in world.completed:
            assert (record.status, record.epoch, completed_at) == (
                Status.COMPLETED,
                *world.completed[key],
            ), "a completed job changed"
        elif record.status is Status.COMPLETED:
            world.completed[key] = (record.epoch, completed_at)
        assert world.completions.get(key, 0) <= 1, "completed twice"
        if record.status is Status.COMPLETED:
            assert completed_at is not None
            assert all(entry.sent for entry in record.outbox.values()), "completed, entry unsent"
        else:
            assert completed_at is None, f"a {record.status.value} job was completed before"
        if record.status is Status.FAILED:
            world.in_review.add(key)
        else:
            assert key not in world.in_review, "a job left the failure path without a replay"

    def teardown(self) -> None:
        for world in self.worlds:
            if isinstance(world.store, BatchingFirestoreJobStore):
                world.store.close()


class MemoryMachine(StoreMachine):
    """The memory store alone, its clock moved by hand: leases lapse by time."""

    leases: ClassVar[dict[str, float]] = {"lapsed": 0.0, "live": 10.0}

    def stores(self) -> list[JobStore]:
        self.clock = Clock()
        return [MemoryJobStore(clock=self.clock)]


def examples(fraction: float, steps: int) -> settings:
    """The loaded profile's settings with a ``fraction`` of its examples, of ``steps`` each."""
    base = settings.default
    assert base is not None
    return settings(
        base, max_examples=max(2, int(base.max_examples * fraction)), stateful_step_count=steps
    )


def test_the_protocol_keeps_the_contract_on_the_memory_store() -> None:
    run_state_machine_as_test(MemoryMachine, settings=examples(1.0, 60))


@pytest.fixture
def firestore_stores(firestore_client: Any) -> Callable[[], list[JobStore]]:
    """Makes, per example, a Firestore and a batching Firestore store (fresh collections)."""

    def make() -> list[JobStore]:
        return [
            FirestoreJobStore(firestore_client, unique_id("model")),
            BatchingFirestoreJobStore(firestore_client, unique_id("model")),
        ]

    return make


def lockstep(firestore_stores: Callable[[], list[JobStore]]) -> type[StoreMachine]:
    """The machine on the memory store and both Firestore stores at once."""

    class Lockstep(StoreMachine):
        def stores(self) -> list[JobStore]:
            return [MemoryJobStore(), *firestore_stores()]

    return Lockstep


@pytest.mark.emulator
def test_every_store_gives_the_same_answers_and_keeps_the_contract(
    firestore_stores: Callable[[], list[JobStore]],
) -> None:
    run_state_machine_as_test(lockstep(firestore_stores), settings=examples(0.1, 20))


@pytest.mark.emulator
def test_earlier_owners_unsent_entries_go_out_in_one_order_on_every_store(
    firestore_stores: Callable[[], list[JobStore]],
) -> None:
    """The long profile's failing example, kept: two steps' entries left unsent (their
    sent marks staged when the operator released the job), published again by the next
    claim. The memory store handed them over in the order they were written, Firestore in
    an order of its own, so the stores published them in different orders; they go out
    by entry id now, on every store."""
    machine = lockstep(firestore_stores)()
    try:
        handle = machine.first_claim(owner="host/1/a", lease="lapsed")
        machine.the_contract_holds_and_the_stores_agree()
        machine.step(handle=handle, name="t0", value=0, publishes=True, pubsub="down")
        machine.the_contract_holds_and_the_stores_agree()
        machine.step(handle=handle, name="s0", value=0, publishes=True, pubsub="up")
        machine.the_contract_holds_and_the_stores_agree()
        for _ in range(4):
            machine.operator_release(n=0, seen="unfenced")
            machine.the_contract_holds_and_the_stores_agree()
        machine.claim(
            owner="host/1/a",
            key="k1",
            lease="lapsed",
            message="redelivery",
            exists_hint=False,
            pubsub="up",
        )
        machine.the_contract_holds_and_the_stores_agree()
        published = [data for _, data, _ in machine.worlds[0].published]
        assert published == [b"t0", b"s0", b"s0", b"t0"]  # the second round: by entry id
    finally:
        machine.teardown()
