"""Effects that happen once: the outbox, the transactional step and the fenced sink,
through their crash windows, with real worker processes and exact counts.

Each test publishes one job (key ``op-1``) and counts what reached the world:
messages on the output topic (pulled until quiet), documents in the sink
collection, effect lines written by the workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle, TcpProxy, drain_messages, unique_id
from pubsub_worker._job.keys import document_id
from pubsub_worker._support import fences
from samples.fenced_sink import FencedSink
from tests.chaos.conftest import BOTH_FLAVOURS
from tests.support.gate import Gate
from tests.support.observe import end_stale_streams
from tests.support.processes import Effects, Worker

KEY = "op-1"

REDELIVERY_S = 100
"""How long a test waits for a message to come back to the surviving worker.

One lease (10 s) once the dead worker's streams are ended at the emulator
(:func:`tests.support.observe.end_stale_streams`, called before the next
worker starts). Left alone, the Pub/Sub emulator keeps a killed or frozen
worker's stream registered and goes on redelivering into it, one ack
deadline (10 s) at a time, until a redelivery picks the live stream:
measured 10, 20, 30 and 50 s after a SIGKILL, and once past 100 s.
"""

pytestmark = [pytest.mark.emulator, pytest.mark.chaos, pytest.mark.timeout(2 * REDELIVERY_S)]


QUIET_S = 2.0
"""Seconds without a new message after which an output subscription counts as drained."""


def job_doc(firestore_client: Any, env: dict[str, str], key: str = KEY) -> dict[str, Any]:
    ref = firestore_client.collection(env["PUBSUB_WORKER_COLLECTION"]).document(
        document_id(env["PUBSUB_WORKER_SUBSCRIPTION"], key)
    )
    snap = ref.get()
    assert snap.exists, f"no job document for {key!r}"
    return dict(snap.to_dict())


def wait_for_status(
    firestore_client: Any, env: dict[str, str], status: str, timeout_s: float = REDELIVERY_S
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = job_doc(firestore_client, env)
        if doc["status"] == status:
            return doc
        time.sleep(0.2)
    raise AssertionError(f"job never reached {status!r}: {doc}")


@pytest.fixture
def output(make_subscription: Any) -> SubscriptionHandle:
    """The downstream topic the workers publish to, with a subscription that counts."""
    handle: SubscriptionHandle = make_subscription(exactly_once=False, prefix="out")
    return handle


@pytest.fixture
def outbox_env(worker_env: dict[str, str], output: SubscriptionHandle) -> dict[str, str]:
    return {**worker_env, "CHAOS_SCENARIO": "outbox", "CHAOS_OUTPUT_TOPIC": output.topic_path}


def test_crash_after_publishing_before_the_ack_publishes_nothing_again(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    output: SubscriptionHandle,
    outbox_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """Crash window 1 of the card: the output is published and the completion durable,
    the process dies before the ack. The next delivery sees the completed effect and
    acks without running or publishing anything."""
    first = workers({**outbox_env, "CHAOS_KILL_AT": "before_ack"}, "first")
    publisher.publish(eod_subscription.topic_path, b"attachment", op=KEY).result()
    first.process.wait(timeout=60)  # killed after the output and the completion, before the ack
    doc = job_doc(firestore_client, outbox_env)
    assert doc["status"] == "completed"
    assert [e["sent"] for e in doc["outbox"].values()] == [True]

    end_stale_streams(subscriber, eod_subscription.subscription_path)  # see REDELIVERY_S
    second = workers(outbox_env, "second")
    second.wait_for_log("job already completed; acked without running", timeout_s=REDELIVERY_S)

    outputs = drain_messages(subscriber, output.subscription_path, quiet_s=QUIET_S)
    assert [m.attributes["effect_key"] for m in outputs] == [f"{KEY}:produce:0"]
    assert outputs[0].data == b"output:attachment"
    assert effects.by_effect() == {"produce": 1, "killed": 1}


@BOTH_FLAVOURS
def test_crash_between_the_step_commit_and_the_publish_publishes_the_entry_once(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    output: SubscriptionHandle,
    outbox_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """The step and its outbox entry are committed, the process dies before publishing:
    the redelivery publishes the pending entry (once) before anything else, and marks
    it sent; the step is not run again."""
    first = workers({**outbox_env, "CHAOS_KILL_AT": "before_publish"}, "first")
    publisher.publish(eod_subscription.topic_path, b"attachment", op=KEY).result()
    first.process.wait(timeout=60)  # killed with the entry committed, not published
    (entry,) = job_doc(firestore_client, outbox_env)["outbox"].values()
    assert (entry["sent"], entry["effect_key"]) == (False, f"{KEY}:produce:0")
    assert drain_messages(subscriber, output.subscription_path, quiet_s=0.5) == []

    end_stale_streams(subscriber, eod_subscription.subscription_path)  # see REDELIVERY_S
    workers(outbox_env, "second")
    doc = wait_for_status(firestore_client, outbox_env, "completed")

    outputs = drain_messages(subscriber, output.subscription_path, quiet_s=QUIET_S)
    assert [
        (m.data, m.attributes["effect_key"], m.attributes["pubsub_worker_step"]) for m in outputs
    ] == [(b"output:attachment", f"{KEY}:produce:0", "produce")]
    assert [e["sent"] for e in doc["outbox"].values()] == [True]
    assert doc["steps"]["produce"]["epoch"] == 1  # recorded by the first owner, not re-run
    assert effects.by_effect() == {"produce": 1, "killed": 1}


def test_a_consumer_keyed_on_the_effect_key_drops_the_republished_duplicate(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    make_subscription: Any,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    """The outbox publishes at least once: killed after publishing and before recording
    it, the producer publishes again on the redelivery, with the same ``effect_key``.
    A consumer of this toolkit keyed on that attribute processes the output once."""
    # Downstream: an exactly-once subscription for a consumer built with this toolkit,
    # and a plain one on the same topic that sees every copy.
    downstream = make_subscription(exactly_once=True, prefix="down")
    every_copy = f"{downstream.subscription_path}-copies"
    subscriber.create_subscription(request={"name": every_copy, "topic": downstream.topic_path})
    try:
        producer_env = {
            **worker_env,
            "CHAOS_SCENARIO": "outbox",
            "CHAOS_OUTPUT_TOPIC": downstream.topic_path,
        }
        # Killed after publishing, before its completion: the redelivery publishes again.
        first = workers({**producer_env, "CHAOS_KILL_AT": "after_publish"}, "producer-1")
        publisher.publish(eod_subscription.topic_path, b"attachment", op=KEY).result()
        first.process.wait(timeout=60)
        end_stale_streams(subscriber, eod_subscription.subscription_path)  # see REDELIVERY_S
        workers(producer_env, "producer-2")
        wait_for_status(firestore_client, producer_env, "completed")

        consumer = workers(
            {
                **worker_env,
                "PUBSUB_WORKER_SUBSCRIPTION": downstream.subscription_path,
                "PUBSUB_WORKER_KEY_ATTRIBUTE": "effect_key",
                "CHAOS_SCENARIO": "steps",
            },
            "consumer",
        )
        consumer.wait_for_log(
            "job already completed; acked without running", timeout_s=REDELIVERY_S
        )

        copies = drain_messages(subscriber, every_copy, quiet_s=QUIET_S)
        assert [m.attributes["effect_key"] for m in copies] == [f"{KEY}:produce:0"] * 2
        assert copies[0].data == copies[1].data
        assert effects.count("a") == effects.count("c") == 1  # processed once downstream
        assert effects.count("a", key=f"{KEY}:produce:0") == 1
        assert effects.count("produce") == 1
    finally:
        subscriber.delete_subscription(request={"subscription": every_copy})


@pytest.fixture
def pubsub_proxy(emulators: Emulators) -> Iterator[TcpProxy]:
    """A proxy in front of the Pub/Sub emulator, for the worker that is frozen."""
    assert emulators.pubsub_host is not None
    with TcpProxy(emulators.pubsub_host) as proxy:
        yield proxy


def _take_over(
    first: Worker,
    proxy: TcpProxy,
    gate: Gate,
    effects: Effects,
    workers: Callable[..., Worker],
    env: dict[str, str],
    *,
    subscriber: Any,
    subscription_path: str,
) -> Worker:
    """Freeze ``first`` at its gate until its lease expires and a second worker finishes.

    ``first`` reaches Pub/Sub through ``proxy``, whose connections are cut once
    it is frozen; the emulator does not notice a cut stream and goes on
    redelivering into it (the second worker waited more than a minute for the
    job, once past 100 s on a loaded machine), so the subscription's streams
    are ended at the emulator too (:func:`tests.support.observe.end_stale_streams`):
    the job comes back one lease after the first's last extension.
    """
    gate.wait_arrived()
    first.pause()  # SIGSTOP: like a long GC pause, nothing of the process runs
    proxy.cut()
    end_stale_streams(subscriber, subscription_path)
    gate.release()  # takes effect only once it runs again
    second = workers(env, "second")
    effects.wait_until("write", 1, timeout_s=REDELIVERY_S)  # the second owner, at epoch 2
    second.wait_for_log("completed (attempt 2, epoch 2)")
    first.resume()
    return second


@BOTH_FLAVOURS
def test_a_paused_owner_s_transactional_write_never_lands(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    output: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
    pubsub_proxy: TcpProxy,
) -> None:
    """Crash window 2 of the card: a worker frozen past its lease, just before its
    transactional step, while another takes the job over and finishes it. Woken up, its
    transaction finds the job at another epoch: its business write and its outbox entry
    never land.

    The transaction's version check alone stops it: the frozen worker runs with its
    generation fence switched off, so the delivery its lease keeper gives up on waking
    (no progress for a lease) does not stop it first. Without the check it commits
    (``tests/integration/test_fences.py`` switches it off)."""
    sink = unique_id("sink")
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "transactional",
        "CHAOS_SINK_COLLECTION": sink,
        "CHAOS_OUTPUT_TOPIC": output.topic_path,
        "CHAOS_GATES": "step:write",
    }
    unfenced = {fences.ENV: "generation", "PUBSUB_EMULATOR_HOST": pubsub_proxy.address}
    first = workers({**env, **unfenced}, "first")
    publisher.publish(eod_subscription.topic_path, b"attachment", op=KEY).result()
    gate = Gate(effects.path, "step:write")
    second = _take_over(
        first,
        pubsub_proxy,
        gate,
        effects,
        workers,
        env,
        subscriber=subscriber,
        subscription_path=eod_subscription.subscription_path,
    )

    # The first owner resumes into its transactional step: its transaction reads the job
    # at epoch 2, and it stops there, without an ack.
    stopped = (
        "ownership lost (the job was claimed at epoch 2 (ours: 1)); "
        "nacked for redelivery without ack"
    )
    first.wait_for_log(stopped, timeout_s=30)
    assert first.log().count(stopped) == 1
    assert "fence(s) generation switched off" in first.log()
    documents = [d.to_dict() for d in firestore_client.collection(sink).stream()]
    assert [(d["key"], d["epoch"], d["pid"]) for d in documents] == [(KEY, 2, second.pid)]
    outputs = drain_messages(subscriber, output.subscription_path, quiet_s=QUIET_S)
    assert [m.attributes["effect_key"] for m in outputs] == [f"{KEY}:write:0"]
    doc = job_doc(firestore_client, env)
    assert (doc["status"], doc["epoch"], doc["steps"]["write"]["epoch"]) == ("completed", 2, 2)
    assert effects.by_effect() == {"write": 1}


def test_the_fenced_sink_refuses_the_paused_owner_s_older_epoch(
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
    pubsub_proxy: TcpProxy,
) -> None:
    """A plain step writes to a sink outside the job store, with ``job.epoch``. The
    worker frozen inside that step writes at epoch 1 after the new owner wrote at
    epoch 2: the fenced sink refuses it, and the frozen worker stops without an ack."""
    sink = unique_id("sink")
    env = {
        **worker_env,
        "CHAOS_SCENARIO": "fenced",
        "CHAOS_SINK_COLLECTION": sink,
        "CHAOS_GATES": "step:write",
    }
    first = workers({**env, "PUBSUB_EMULATOR_HOST": pubsub_proxy.address}, "first")
    publisher.publish(eod_subscription.topic_path, b"attachment", op=KEY).result()
    gate = Gate(effects.path, "step:write")
    second = _take_over(
        first,
        pubsub_proxy,
        gate,
        effects,
        workers,
        env,
        subscriber=subscriber,
        subscription_path=eod_subscription.subscription_path,
    )

    # The first owner resumes inside its step and writes at epoch 1, after epoch 2 did.
    effects.wait_until("refused", 1, timeout_s=30)
    first.wait_for_log("ownership lost")  # stopped without an ack
    stored = FencedSink(firestore_client, sink).read(KEY)
    assert stored is not None
    assert (stored["epoch"], stored["value"]) == (2, {"pid": second.pid})
    assert [(e["effect"], e["epoch"], e["pid"]) for e in effects.read()] == [
        ("write", 2, second.pid),
        ("refused", 1, first.pid),
    ]
    doc = job_doc(firestore_client, env)
    assert (doc["status"], doc["epoch"], doc["steps"]["write"]["epoch"]) == ("completed", 2, 2)
