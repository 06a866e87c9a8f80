"""Each fence on its own: the race it guards, with the fence (it holds) and without it (it breaks).

A test of a fence must fail when that fence alone is removed. For each fence
of :mod:`pubsub_worker._support.fences`, one scenario on the real emulators
provokes exactly the race the fence guards, deterministically: a delivery is
held at a named point (a store call, or a line of its handler) until another
has done what the race needs, then let go. The scenario runs twice: with
every fence on, where exact counts show the fence held; and with that one
fence switched off, the others on, where the violation it guards against is
observed (a second completion, a stale step record landing, a stale
delivery settling, an ack with no durable completion, a completion with an
unsent outbox entry).

The deliveries are real: pulled from an exactly-once subscription one at a
time (:class:`Inbox`) and handed to the worker as the client's own
``Message``, whose acks, nacks, deadlines and drops reach the emulator at
once and are recorded with Pub/Sub's answer. Each worker (:class:`Node`) is
an :func:`pubsub_worker.exactly_once` of its own (its own owner id, tracker
and key gate, as a second process would have) on the real Firestore store.
Leases are long (300 s): no lease runs out in a scenario (but the one
whose race is a lease running out), so only the fence under test is in play.

This module holds the harness and the claim's fence;
``test_fences_lease.py`` the claim's wait for a live lease (live-lease);
``test_fences_writes.py`` the owner's writes (commit, transaction);
``test_fences_delivery.py`` a delivery's (generation, durable-ack, outbox);
``test_fences_review.py`` the failure path's (review-mark);
``test_fences_operator.py`` the operator's (expect-epoch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud.pubsub_v1.subscriber import message as client_message
from google.cloud.pubsub_v1.subscriber._protocol import requests
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

import pubsub_worker
from emulator import Emulators, SubscriptionHandle
from pubsub_worker._job.keys import document_id
from pubsub_worker._ops.jobs import ReleaseResult, release
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, replay
from pubsub_worker._support import fences
from pubsub_worker._support.clients import publisher_function
from pubsub_worker.stores import base as s
from pubsub_worker.stores.firestore import FirestoreJobStore
from tests.support.observe import job_document

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(90)]

KEY = "op-1"
LEASE_S = 300
"""No lease (Pub/Sub's or Firestore's) runs out, nor is renewed, within a scenario."""
WAIT_S = 30.0
"""The longest a scenario waits for one thread to reach a point (a loaded machine)."""

TWINS = pytest.mark.parametrize(
    "fenced", [True, False], ids=["holds with the fence", "breaks without it"]
)
"""Each scenario twice: with every fence (it holds), and with its own fence switched off."""


def switched_off(name: fences.Fence, fenced: bool) -> AbstractContextManager[None]:
    """Nothing for the fenced twin; the fence switched off (in this process) for the other."""
    return nullcontext() if fenced else fences.disabled(name)


# -- holding a thread at a point ------------------------------------------------------


@dataclass
class Hold:
    """A point where one thread stops until the test lets it go."""

    arrived: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def stop_here(self) -> None:
        """Called by the held thread."""
        self.arrived.set()
        assert self.go.wait(WAIT_S * 2), "the test never let the held thread go"

    def wait_arrived(self) -> None:
        assert self.arrived.wait(WAIT_S), "no thread reached the hold"

    def release(self) -> None:
        self.go.set()


class HeldStore(FirestoreJobStore):
    """The Firestore job store, whose next call of a kind can be held."""

    def __init__(self, client: Any, collection: str) -> None:
        super().__init__(client, collection)
        self._holds: dict[str, Hold] = {}

    def hold(self, call: str) -> Hold:
        """Hold the next ``create``; the next ``claim`` (an update that changes the owner);
        the next ``mark`` (the review marked sent); or right after the next ``read``."""
        self._holds[call] = hold = Hold()
        return hold

    def _reached(self, call: str) -> None:
        hold = self._holds.pop(call, None)
        if hold is not None:
            hold.stop_here()

    def create(self, doc_id: str, fields: Any) -> s.Version:
        self._reached("create")
        return super().create(doc_id, fields)

    def update(self, doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        if (s.OWNER,) in changes:
            self._reached("claim")
        if changes.get((s.REVIEW,)) == s.Review.SENT.value:
            self._reached("mark")
        return super().update(doc_id, changes, expected=expected)

    def get(self, doc_id: str) -> s.Snapshot | None:
        snap = super().get(doc_id)
        self._reached("read")
        return snap


# -- real deliveries ------------------------------------------------------------------


@dataclass(frozen=True)
class Told:
    """What the library told Pub/Sub about one delivery, and Pub/Sub's answer."""

    ack_id: str
    what: str
    """``ack``, ``nack``, ``deadline N`` or ``drop``."""
    answer: str
    """``SUCCESS``, an ``AcknowledgeStatus`` name, or ``-`` for a drop (no RPC)."""
    status: str | None = None
    """An ack: the job document's status when the ack was sent."""


class Inbox:
    """An exactly-once subscription's deliveries, pulled one at a time.

    Each is the client's own ``Message``; this inbox is its request queue:
    what the library tells Pub/Sub goes to the emulator at once (the ack's
    future gets Pub/Sub's answer) and is recorded in :attr:`told`, an ack
    with the job document's status at that moment (``status()``).
    """

    def __init__(self, subscriber: Any, path: str, status: Callable[[], str | None]) -> None:
        self._subscriber = subscriber
        self._path = path
        self._status = status
        self._lock = threading.Lock()
        self.told: list[Told] = []

    def next(self) -> client_message.Message:
        """The next delivery the subscription hands out (a redelivery too)."""
        request = {"subscription": self._path, "max_messages": 1, "return_immediately": True}
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            response = self._subscriber.pull(request=request, timeout=10)
            if response.received_messages:
                received = response.received_messages[0]
                raw = type(received.message).pb(received.message)
                return client_message.Message(
                    raw, received.ack_id, received.delivery_attempt, self, lambda: True
                )
            time.sleep(0.05)
        raise AssertionError(f"nothing delivered within {WAIT_S} s")

    def redeliver(self, message: client_message.Message) -> client_message.Message:
        """A new delivery of ``message`` (its deadline set to 0, as when a lease lapses)."""
        self._rpc("modify_ack_deadline", message.ack_id, ack_deadline_seconds=0)
        again = self.next()
        assert (again.message_id, again.ack_id != message.ack_id) == (message.message_id, True)
        return again

    def of(self, message: client_message.Message) -> list[str]:
        """What the library told Pub/Sub about this delivery, with the answers."""
        return [f"{t.what}: {t.answer}" for t in self.told if t.ack_id == message.ack_id]

    def put(self, request: Any) -> None:
        """The message's request queue: carried out at once, on the caller's thread."""
        if isinstance(request, requests.DropRequest):
            self._record(Told(request.ack_id, "drop", "-"))
            return
        if isinstance(request, requests.AckRequest):
            status = self._status()
            answer = self._rpc("acknowledge", request.ack_id)
            self._record(Told(request.ack_id, "ack", answer, status))
        elif isinstance(request, requests.NackRequest):
            answer = self._rpc("modify_ack_deadline", request.ack_id, ack_deadline_seconds=0)
            self._record(Told(request.ack_id, "nack", answer))
        elif isinstance(request, requests.ModAckRequest):
            seconds = int(request.seconds)
            answer = self._rpc("modify_ack_deadline", request.ack_id, ack_deadline_seconds=seconds)
            self._record(Told(request.ack_id, f"deadline {seconds}", answer))
        else:
            return
        future = request.future
        if future is not None:
            if answer == "SUCCESS":
                future.set_result(AcknowledgeStatus.SUCCESS)
            else:
                future.set_exception(AcknowledgeError(AcknowledgeStatus[answer], answer))

    def _rpc(self, method: str, ack_id: str, **extra: Any) -> str:
        request = {"subscription": self._path, "ack_ids": [ack_id], **extra}
        try:
            getattr(self._subscriber, method)(request=request, timeout=10)
        except gexc.InvalidArgument:
            return "INVALID_ACK_ID"  # a stale or settled ack id
        except gexc.FailedPrecondition:
            return "FAILED_PRECONDITION"
        return "SUCCESS"

    def _record(self, told: Told) -> None:
        with self._lock:
            self.told.append(told)


class Node:
    """One worker (its own owner id, tracker and key gate), handed deliveries by the test."""

    def __init__(self, name: str, handler: Any, world: World, **settings: Any) -> None:
        self.name = name
        self.store = HeldStore(world.firestore_client, world.settings.collection)
        self.wrapped = pubsub_worker.exactly_once(
            handler,
            settings=world.settings.model_copy(update=settings),
            store=self.store,
            publisher=world.publisher,
        )
        self.wrapped.start(check_subscription=False)
        self._threads: list[threading.Thread] = []

    def deliver(self, message: client_message.Message) -> threading.Thread:
        """The delivery, on a callback thread of its own; joined once it is settled."""
        thread = threading.Thread(target=self.wrapped, args=(message,), name=f"{self.name}-cb")
        thread.start()
        self._threads.append(thread)
        return thread

    def close(self) -> None:
        for thread in self._threads:
            thread.join(WAIT_S)
        self.wrapped.close()


def settled(*threads: threading.Thread) -> None:
    """Wait until each delivery's callback returned: it is concluded and settled."""
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive(), f"{thread.name} did not conclude"


@dataclass
class World:
    """A test's subscription, collection, workers and what happened."""

    emulators: Emulators
    publisher: Any
    subscriber: Any
    firestore_client: Any
    subscription: SubscriptionHandle
    settings: pubsub_worker.Settings
    inbox: Inbox = field(init=False)
    nodes: list[Node] = field(default_factory=list)
    effects: list[tuple[str, str, int]] = field(default_factory=list)
    """``(node, effect, epoch)`` of every effect a handler had, in order."""

    def __post_init__(self) -> None:
        self.inbox = Inbox(self.subscriber, self.subscription.subscription_path, self.status)

    def node(self, name: str, handler: Any, **settings: Any) -> Node:
        """A worker running ``handler``, with the test's settings (``settings`` changed)."""
        worker = Node(name, handler, self, **settings)
        self.nodes.append(worker)
        return worker

    def publish(self, data: bytes = b"payload") -> str:
        return str(self.publisher.publish(self.subscription.topic_path, data, op=KEY).result())

    def effect(self, node: str, what: str, epoch: int) -> None:
        self.effects.append((node, what, epoch))

    def job(self) -> dict[str, Any]:
        return job_document(
            self.firestore_client, self.settings.collection, self.settings.subscription_path, KEY
        )

    def status(self) -> str | None:
        """The job document's status now (None: no document)."""
        doc_id = document_id(self.settings.subscription_path, KEY)
        snap = FirestoreJobStore(self.firestore_client, self.settings.collection).get(doc_id)
        return None if snap is None else str(snap.fields[s.STATUS])

    def release_job(self, expect_epoch: int | None = None) -> ReleaseResult:
        """``pubsub-worker jobs release``: the epoch moves on, the current owner is fenced."""
        store = FirestoreJobStore(self.firestore_client, self.settings.collection)
        return release(store, self.settings.subscription_path, KEY, expect_epoch=expect_epoch)

    def replay_job(self) -> None:
        """``pubsub-worker jobs replay``: the failed job reset (a new epoch), its message
        published again."""
        store = FirestoreJobStore(self.firestore_client, self.settings.collection)
        doc_id = document_id(self.settings.subscription_path, KEY)
        snap = store.get(doc_id)
        assert snap is not None
        [result] = replay(
            store,
            [FailedJob(doc_id, s.JobRecord.parse(snap.fields))],
            topic=self.subscription.topic_path,
            publish=publisher_function(self.publisher),
            key_attribute="op",
        )
        assert result.kind is ReplayOutcome.REPLAYED, result.reason


@pytest.fixture
def world(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    make_subscription: Any,
    settings_for: Callable[..., pubsub_worker.Settings],
) -> Iterator[World]:
    """Workers on a fresh exactly-once subscription (60 s deadline) and collection."""
    subscription = make_subscription(exactly_once=True, ack_deadline_seconds=60)
    settings = settings_for(
        subscription,
        key_attribute="op",
        lease_seconds=LEASE_S,
        max_processing_seconds=2 * LEASE_S,
    )
    made = World(emulators, publisher, subscriber, firestore_client, subscription, settings)
    yield made
    for worker in made.nodes:
        worker.close()


# -- claim: create-if-absent, and the compare-and-set ----------------------------------


def steps_handler(world: World, name: str) -> Callable[[Any, pubsub_worker.Job], None]:
    """One step, ``charge``, whose effect is counted; a first attempt fails."""

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        if job.attempt == 1 and message.attributes.get("fail") == "first":
            raise RuntimeError("the first attempt fails")

        def charge() -> str:
            world.effect(name, "charge", job.epoch)
            return "charged"

        job.step("charge", charge)

    return handle


@TWINS
def test_claim_a_new_job_is_created_once(world: World, fenced: bool) -> None:
    """Two deliveries of one new job (two messages, one key) claim it at once.

    A's create is held; B creates the job, runs it and acks; then A's create
    is let go. It finds the job there (create-if-absent): it reads it
    completed and acks without running. Without the fence, A's claim writes
    over the completed job and runs it again: a second completion.
    """
    a = world.node("a", steps_handler(world, "a"))
    b = world.node("b", steps_handler(world, "b"))
    held = a.store.hold("create")
    world.publish()
    first = world.inbox.next()
    late = a.deliver(first)
    held.wait_arrived()
    world.publish()
    second = world.inbox.next()
    settled(b.deliver(second))
    assert world.effects == [("b", "charge", 1)]

    with switched_off("claim", fenced):
        held.release()
        settled(late)

    doc = world.job()
    if fenced:
        assert world.effects == [("b", "charge", 1)]
        assert world.inbox.of(first) == ["ack: SUCCESS"]  # "job already completed"
        assert a.wrapped.metrics.get(pubsub_worker.Counter.ALREADY_DONE) == 1
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 0
    else:
        assert world.effects == [("b", "charge", 1), ("a", "charge", 1)]  # run twice
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 1  # a second completion
    assert world.inbox.of(second) == ["ack: SUCCESS"]
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)


@TWINS
def test_claim_of_a_released_job_is_a_compare_and_set(world: World, fenced: bool) -> None:
    """Two deliveries read the same released job and both decide to claim it.

    The first attempt failed (released, one attempt counted). A read the job
    and its claim's write is held; B claims it (epoch 2), runs it and acks;
    then A's write is let go. Conditioned on the version A read, it is
    refused: A reads again, finds the job completed and acks without
    running. Without the fence, A's take-over lands over B's completion and
    runs the job again: a second completion.
    """
    a = world.node("a", steps_handler(world, "a"))
    b = world.node("b", steps_handler(world, "b"))
    world.publisher.publish(world.subscription.topic_path, b"payload", op=KEY, fail="first")
    settled(b.deliver(world.inbox.next()))  # attempt 1 fails: released, nacked
    assert world.job()["status"] == "released"
    held = a.store.hold("claim")
    first = world.inbox.next()  # the nacked message again
    late = a.deliver(first)
    held.wait_arrived()
    world.publish()
    second = world.inbox.next()
    settled(b.deliver(second))
    assert world.effects == [("b", "charge", 2)]

    with switched_off("claim", fenced):
        held.release()
        settled(late)

    doc = world.job()
    if fenced:
        assert world.effects == [("b", "charge", 2)]
        assert world.inbox.of(first) == ["ack: SUCCESS"]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 0
    else:
        assert world.effects == [("b", "charge", 2), ("a", "charge", 2)]
        assert a.wrapped.metrics.get(pubsub_worker.Counter.COMPLETED) == 1
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 2)
