"""Ordering keys with a real worker process: a job that is not done holds back the rest of its key.

The subscription has message ordering and exactly-once delivery; four
messages share one ordering key (``customer-7``), each a job of its own
(``op`` = ``k1`` .. ``k4``), published one Publish call at a time so that
each has its own publish time. They are all published before the worker
starts, so the worker holds the whole key when the first job ends. The worker
is ``python -m tests.support.ordering_worker``: every run of the handler
appends an ``attempt`` effect, and the work of a job appends ``done`` from
inside its one step; the effects file's order of the ``done`` lines is the
order in which the jobs took effect. The last test shows a defect: messages
published in one Publish request can share a publish time, and then the
later one is not held back.

The stock client hands out the next message of a key as soon as the previous
one is nacked or dropped (``../shared/EMULATOR_FACTS.md``, "Ordering keys in
the stock client"), so without the worker's own protection the second job
would run while the first waits for its redelivery. The ``no-ordering-key``
cases run the same scenario with the same messages published without an
ordering key (see :func:`jobs_subscription`): nothing holds the later jobs
back, which shows that the first message really was retried or deferred
while they could have run.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
import pytest

from emulator import Emulators, SubscriptionHandle, subscription_path, unique_id
from pubsub_worker._job.claim import ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import derive_identity
from pubsub_worker.stores import base as s
from pubsub_worker.stores.firestore import FirestoreJobStore
from tests.chaos.conftest import LEASE_S
from tests.support.observe import collect, job_document, number, wait_until_let_go
from tests.support.processes import Effects, Worker, start_worker, stop_all

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

JOBS = ("k1", "k2", "k3", "k4")
"""The job keys, in publish order."""

ORDERING_KEY = "customer-7"
PAYLOAD = b"payload"
ORDER_DEFERRAL = "an earlier message of its ordering key is not done yet"
"""What the worker logs when it defers a message for an earlier one of its key."""

HOLD_LEASE_S = 20.0
"""The lease of the other owner that holds ``k1`` busy: past the worker's 10 s of polling."""

WITH_AND_WITHOUT_KEY = pytest.mark.parametrize(
    "ordering_key", [ORDERING_KEY, ""], ids=["one-ordering-key", "no-ordering-key"], indirect=True
)
"""Run a test with its messages under one ordering key, and without one (for comparison)."""


@pytest.fixture(scope="module")
def ordered_publisher(emulators: Emulators) -> Iterator[Any]:
    """A publisher with message ordering enabled (needed to publish with an ordering key)."""
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    client: Any = pubsub_v1.PublisherClient(publisher_options=options)
    try:
        yield client
    finally:
        client.stop()
        client.transport.close()


@pytest.fixture
def ordering_key(request: pytest.FixtureRequest) -> str:
    """The messages' ordering key: :data:`ORDERING_KEY` unless a test asks for none ("")."""
    return str(getattr(request, "param", ORDERING_KEY))


@pytest.fixture
def jobs_subscription(ordering_key: str, make_subscription: Any) -> SubscriptionHandle:
    """A fresh topic with an exactly-once subscription, ordering messages if they have a key.

    Messages without a key go to a subscription without message ordering: on
    the emulator, a subscription with ordering treats them as one more key
    (measured with the stock client alone: while the first is deferred, the
    acks of the later ones get no answer, then all come back with it, and
    the first acks are refused), which production does not do.
    """
    handle: SubscriptionHandle = make_subscription(exactly_once=True, ordering=bool(ordering_key))
    return handle


@pytest.fixture
def ordering_env(
    emulators: Emulators,
    jobs_subscription: SubscriptionHandle,
    firestore_collection: str,
    effects: Effects,
) -> dict[str, str]:
    """Environment of an ordering worker on this test's subscription, with a 10 s lease."""
    return {
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": jobs_subscription.subscription_path,
        "PUBSUB_WORKER_COLLECTION": firestore_collection,
        "PUBSUB_WORKER_KEY_ATTRIBUTE": "op",
        "PUBSUB_WORKER_LEASE_SECONDS": str(LEASE_S),
        "PUBSUB_WORKER_MAX_PROCESSING_SECONDS": "120",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "5",
        "CHAOS_EFFECTS": str(effects.path),
    }


@pytest.fixture
def ordering_workers(tmp_path: Path) -> Iterator[Any]:
    """``ordering_workers(env)`` starts an ordering worker; all are killed at the end."""
    started: list[Worker] = []

    def start(env: dict[str, str], name: str = "worker") -> Worker:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        worker = start_worker(env, log_path, name, module="tests.support.ordering_worker")
        started.append(worker)
        return worker

    yield start
    stop_all(started)


def publish_one_by_one(publisher: Any, topic: str, ordering_key: str) -> list[str]:
    """Publish one message per job of :data:`JOBS`, each in its own Publish call; their ids."""
    options = {"ordering_key": ordering_key} if ordering_key else {}
    return [publisher.publish(topic, PAYLOAD, op=key, **options).result() for key in JOBS]


def wait_all_acked(worker: Worker, message_ids: list[str], timeout_s: float = 60) -> None:
    """Wait until Pub/Sub accepted an ack of every message: none of them comes back."""
    for message_id in message_ids:
        worker.wait_for_log(
            f'"message": "ack of message {message_id}: SUCCESS"', timeout_s=timeout_s
        )


def took_effect(effects: Effects) -> list[str]:
    """The jobs whose work was done, in the order it was done (the effects file's order)."""
    return [str(e["key"]) for e in effects.read() if e["effect"] == "done"]


def attempts(effects: Effects) -> dict[str, list[int]]:
    """Per job, the attempt number of every run of the handler, in order."""
    runs: dict[str, list[int]] = {}
    for e in effects.read():
        if e["effect"] == "attempt":
            runs.setdefault(str(e["key"]), []).append(number(e, "attempt"))
    return runs


def published(effects: Effects) -> dict[str, float]:
    """Per job, its message's publish time (seconds since the epoch), as the worker saw it."""
    return {str(e["key"]): float(str(e["published"])) for e in effects.read()}


class OutOfOrder(AssertionError):
    """The jobs of one ordering key took effect out of their publish order."""


def assert_in_publish_order(effects: Effects, jobs: tuple[str, ...] = JOBS) -> None:
    """Each job's work was done after the work of every job published before it."""
    order = took_effect(effects)
    if order != list(jobs):
        raise OutOfOrder(f"the jobs took effect in the order {order}, published as {list(jobs)}")


def order_deferrals(worker: Worker, key: str, message_id: str) -> int:
    """How many times the worker deferred ``message_id`` for an earlier message of its key."""
    return worker.log().count(f"job {key} message {message_id}: {ORDER_DEFERRAL}")


def assert_each_took_effect_once(effects: Effects, ordering_key: str) -> None:
    """Every job's work was done once, each message carried ``ordering_key`` and its own time."""
    assert Counter(took_effect(effects)) == Counter(JOBS)
    assert all(e["ordering_key"] == ordering_key for e in effects.read())
    times = published(effects)
    assert [times[key] for key in JOBS] == sorted(set(times.values())), (
        f"each message needs a publish time of its own, later than the one before: {times}"
    )


@WITH_AND_WITHOUT_KEY
def test_a_failed_first_attempt_holds_back_the_rest_of_its_key(
    ordering_key: str,
    ordered_publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    jobs_subscription: SubscriptionHandle,
    ordering_env: dict[str, str],
    effects: Effects,
    ordering_workers: Any,
) -> None:
    """RETRY: the first job's first attempt fails (released, counted, nacked).

    With one ordering key, the three later messages arrive while the first
    waits for its redelivery; each is deferred, not claimed, and every job
    takes effect exactly once, in publish order. Without an ordering key the
    same messages run at once: none is deferred for order (the order of their
    effects is not asserted).
    """
    sub = jobs_subscription.subscription_path
    ids = publish_one_by_one(ordered_publisher, jobs_subscription.topic_path, ordering_key)
    worker = ordering_workers({**ordering_env, "ORDERING_FAIL_ONCE": "k1"})
    wait_all_acked(worker, ids)
    worker.kill()

    assert_each_took_effect_once(effects, ordering_key)
    assert attempts(effects) == {"k1": [1, 2], "k2": [1], "k3": [1], "k4": [1]}
    for key in JOBS:
        doc = job_document(firestore_client, firestore_collection, sub, key)
        assert (doc["status"], doc["attempts"]) == ("completed", 2 if key == "k1" else 1)
    if ordering_key:
        assert_in_publish_order(effects)
        assert order_deferrals(worker, "k2", ids[1]) >= 1, worker.log()[-4000:]
    else:
        assert ORDER_DEFERRAL not in worker.log()


def hold_job(store: FirestoreJobStore, subscription: str, key: str) -> Callable[[], None]:
    """Claim ``key`` as another owner would, with a live lease of :data:`HOLD_LEASE_S`.

    Returns that owner's release of the job (status ``released``, as its own
    release would write).
    """
    identity = derive_identity(
        subscription=subscription,
        message_id="held-elsewhere",
        attributes={"op": key},
        data=PAYLOAD,
        key_attribute="op",
    )
    request = ClaimRequest(
        identity=identity,
        owner="other-host/4242/beef",
        message_id="held-elsewhere",
        delivery="held-elsewhere",
        lease_s=HOLD_LEASE_S,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )
    held = claim(store, request)
    assert held.kind is ClaimKind.CLAIMED
    version = held.version
    assert version is not None

    def let_go() -> None:
        now = datetime.now(timezone.utc)
        changes: dict[tuple[str, ...], Any] = {
            (s.STATUS,): s.Status.RELEASED.value,
            (s.UPDATED_AT,): now,
        }
        store.update(identity.doc_id, changes, expected=version)

    return let_go


@WITH_AND_WITHOUT_KEY
def test_a_first_job_busy_with_another_owner_holds_back_the_rest_of_its_key(
    ordering_key: str,
    ordered_publisher: Any,
    firestore_client: Any,
    firestore_collection: str,
    jobs_subscription: SubscriptionHandle,
    ordering_env: dict[str, str],
    effects: Effects,
    ordering_workers: Any,
) -> None:
    """DEFER: the first job's document is held by another owner's live lease.

    The worker polls the busy job, then defers its message until the lease
    ends. With one ordering key, the later messages come while it is away and
    are deferred too: none of them takes effect before the first, which runs
    once the other owner lets it go. Without an ordering key the later jobs
    all take effect while the first is still held (the test lets it go only
    then), which shows the first message really was deferred.
    """
    sub = jobs_subscription.subscription_path
    store = FirestoreJobStore(firestore_client, firestore_collection)
    let_go = hold_job(store, sub, "k1")
    ids = publish_one_by_one(ordered_publisher, jobs_subscription.topic_path, ordering_key)
    worker = ordering_workers(ordering_env)
    worker.wait_for_log(f"job k1 message {ids[0]}: another owner holds a live lease")
    if ordering_key:
        wait_until_let_go(worker, ids[1])  # the second message came, and was let go
        assert took_effect(effects) == []
        assert order_deferrals(worker, "k2", ids[1]) == 1
    else:
        effects.wait_until("done", len(JOBS) - 1, timeout_s=30)
    let_go()
    wait_all_acked(worker, ids)
    worker.kill()

    assert_each_took_effect_once(effects, ordering_key)
    assert attempts(effects) == {key: [2 if key == "k1" else 1] for key in JOBS}
    doc = job_document(firestore_client, firestore_collection, sub, "k1")
    assert (doc["status"], doc["epoch"]) == ("completed", 2)
    if ordering_key:
        assert_in_publish_order(effects)
    else:
        assert took_effect(effects)[-1] == "k1"  # the others did not wait for it
        assert ORDER_DEFERRAL not in worker.log()


def test_a_reviewed_job_does_not_hold_back_the_rest_of_its_key(
    ordered_publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    jobs_subscription: SubscriptionHandle,
    make_subscription: Any,
    ordering_env: dict[str, str],
    effects: Effects,
    ordering_workers: Any,
) -> None:
    """REVIEW: the first job raises ``PermanentError`` and goes to the failure topic.

    Like a dead-letter topic, the reviewed job frees its key: no later message
    of the key is deferred for it, the other three take effect in publish
    order, and the failure topic gets exactly one message, the first job's.
    """
    sub = jobs_subscription.subscription_path
    review = make_subscription(exactly_once=False)  # the failure topic, and a way to read it
    env = {
        **ordering_env,
        "ORDERING_PERMANENT": "k1",
        "PUBSUB_WORKER_FAILURE_TOPIC": review.topic_path,
    }
    ids = publish_one_by_one(ordered_publisher, jobs_subscription.topic_path, ORDERING_KEY)
    worker = ordering_workers(env)
    wait_all_acked(worker, ids)
    worker.kill()
    reviewed = collect(subscriber, review.subscription_path, until=time.monotonic() + 1.0)

    assert took_effect(effects) == ["k2", "k3", "k4"]
    assert attempts(effects) == {key: [1] for key in JOBS}
    assert ORDER_DEFERRAL not in worker.log()
    assert [(m.attributes["op"], m.attributes["pubsub_worker_reason"]) for m in reviewed] == [
        ("k1", "permanent")
    ]
    assert reviewed[0].attributes["pubsub_worker_message_id"] == ids[0]
    statuses = {
        key: job_document(firestore_client, firestore_collection, sub, key)["status"]
        for key in JOBS
    }
    assert statuses == {"k1": "failed", "k2": "completed", "k3": "completed", "k4": "completed"}


BATCH = tuple(f"b{n}" for n in range(1, 7))
"""The jobs of :func:`test_messages_published_in_one_request_are_held_back_too`."""


def test_messages_published_in_one_request_are_held_back_too(
    emulators: Emulators,
    subscriber: Any,
    jobs_subscription: SubscriptionHandle,
    ordering_env: dict[str, str],
    effects: Effects,
    ordering_workers: Any,
) -> None:
    """RETRY, as above, with the messages sent in one Publish request, as a batching publisher does.

    Pub/Sub stamps publish times as it receives a Publish request; on the
    emulator (milliseconds) messages of one request often share one. A second
    subscription on the topic reads the publish times first; the job whose
    message shares its publish time with the next one fails its first attempt.
    The next message must still wait for it.
    """
    topic = jobs_subscription.topic_path
    observer = subscription_path(emulators.project, unique_id("observer"))
    subscriber.create_subscription(request={"name": observer, "topic": topic})
    batching = pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.5)
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    publisher: Any = pubsub_v1.PublisherClient(batch_settings=batching, publisher_options=options)
    try:
        futures = [
            publisher.publish(topic, PAYLOAD, op=key, ordering_key=ORDERING_KEY) for key in BATCH
        ]
        ids = [future.result() for future in futures]
        seen = collect(subscriber, observer, until=time.monotonic() + 1.0, at_least=len(BATCH))
    finally:
        publisher.stop()
        publisher.transport.close()
        subscriber.delete_subscription(request={"subscription": observer})
    times = {m.attributes["op"]: m.publish_time.timestamp() for m in seen}
    tied = [a for a, b in itertools.pairwise(BATCH) if times[a] == times[b]]
    if not tied:
        pytest.skip(f"no two messages of the request got the same publish time: {times}")
    worker = ordering_workers({**ordering_env, "ORDERING_FAIL_ONCE": tied[0]})
    wait_all_acked(worker, ids)
    worker.kill()

    assert Counter(took_effect(effects)) == Counter(BATCH)
    assert attempts(effects) == {key: [1, 2] if key == tied[0] else [1] for key in BATCH}
    assert_in_publish_order(effects, BATCH)
