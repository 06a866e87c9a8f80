"""What a crash-window test reads back: job documents, and what Pub/Sub still holds.

A quirk of the Pub/Sub emulator shapes the Pub/Sub-side checks. When a
client goes without half-closing its streaming pull (SIGKILL, a cut
connection, or a close that cancels it, as the stock client's does), the
emulator never notices: that stream's push
loop keeps taking messages from the subscription every 50 ms and writes
them into the void. Each message it takes stays leased for an ack deadline,
then the loop may take it again. Measured here: after a SIGKILL, a live
worker got the redelivery after 10 s in 15 of 26 runs, else after 20, 30, 60
or 80 s; a synchronous pull never got it within 45 s. The loop ends only when
the subscription stops being a pull subscription (or the stream's deadline
passes, 30 minutes after it opened), which :func:`end_stale_streams`
(:func:`emulator.end_streams`) makes happen for an instant. With no stale stream
left, a redelivery comes exactly one ack deadline (10.0-10.1 s) after the
last lease extension, and a synchronous pull sees it.
"""

from __future__ import annotations

import time
from typing import Any

from emulator import end_streams
from pubsub_worker._job.keys import document_id
from tests.support.processes import Effects, Worker

end_stale_streams = end_streams
"""Ends every stream of a subscription at the emulator (only while no worker consumes it)."""

REDELIVERY_MARGIN_S = 2.0
"""Added to the lease when waiting for a redelivery that must not come."""


def job_document(
    firestore_client: Any, collection: str, subscription_path: str, key: str
) -> dict[str, Any]:
    """The job document of ``key`` on ``subscription_path``; fails if there is none."""
    snap = firestore_client.collection(collection).document(document_id(subscription_path, key))
    doc = snap.get()
    assert doc.exists, f"no job document for key {key!r}"
    return dict(doc.to_dict() or {})


def step_epochs(doc: dict[str, Any]) -> dict[str, int]:
    """``{step name: epoch of the owner that recorded it}``."""
    return {name: int(record["epoch"]) for name, record in (doc.get("steps") or {}).items()}


def pull_now(subscriber: Any, subscription_path: str, *, ack: bool = True) -> list[Any]:
    """Messages available right now (``return_immediately``); acked unless ``ack=False``."""
    response = subscriber.pull(
        request={
            "subscription": subscription_path,
            "max_messages": 100,
            "return_immediately": True,
        },
        timeout=10,
    )
    received = list(response.received_messages)
    if received and ack:
        subscriber.acknowledge(
            request={
                "subscription": subscription_path,
                "ack_ids": [message.ack_id for message in received],
            }
        )
    return received


def assert_not_redelivered(subscriber: Any, subscription_path: str, *, lease_s: float) -> None:
    """Fail if ``subscription_path`` hands out any message within one lease (plus a margin).

    Call it after every worker of the subscription was killed; it ends their
    stale streams first. A message that was not acked (dropped, nacked, or its
    ack refused) is held at most one lease past its last lease extension, and
    every extension was sent before the workers died, so it would come back
    within the window, and nobody but this pull can take it.
    """
    end_stale_streams(subscriber, subscription_path)
    deadline = time.monotonic() + lease_s + REDELIVERY_MARGIN_S
    while True:
        received = pull_now(subscriber, subscription_path)
        assert not received, (
            "a message came back after it was acked: "
            f"{[(m.message.message_id, dict(m.message.attributes)) for m in received]}"
        )
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)


def collect(
    subscriber: Any, subscription_path: str, *, until: float, at_least: int = 0
) -> list[Any]:
    """Pull (and ack) everything until ``until`` (a ``time.monotonic()``).

    Returns the ``PubsubMessage`` objects, one per message id; fails if fewer
    than ``at_least`` arrived.
    """
    seen: dict[str, Any] = {}
    while True:
        for received in pull_now(subscriber, subscription_path):
            seen.setdefault(received.message.message_id, received.message)
        if time.monotonic() >= until:
            break
        time.sleep(0.25)
    assert len(seen) >= at_least, f"{len(seen)} message(s) arrived, wanted at least {at_least}"
    return list(seen.values())


def number(effect: dict[str, object], name: str) -> int:
    """An integer field of an effect line (``pid``, ``epoch``, ``attempt``)."""
    value = effect[name]
    assert isinstance(value, int), (name, effect)
    return value


def runs(effects: Effects, name: str, key: str | None = None) -> list[tuple[int, int]]:
    """``(pid, epoch)`` of every effect ``name`` (of job ``key``), in the order they happened."""
    return [
        (number(e, "pid"), number(e, "epoch"))
        for e in effects.read()
        if e["effect"] == name and (key is None or e["key"] == key)
    ]


def pids(effects: Effects, *, but: str = "killed") -> set[int]:
    """The processes that had effects (other than ``but``, the kill marker)."""
    return {number(e, "pid") for e in effects.read() if e["effect"] != but}


def deliveries(worker: Worker, message_id: str) -> int:
    """How many deliveries of ``message_id`` the worker's wrapper was handed."""
    return worker.log().count(f'"message": "received message {message_id}"')


def acks(worker: Worker, message_id: str) -> list[str]:
    """Pub/Sub's answers to the worker's acks of ``message_id``: ``SUCCESS`` or the refusal."""
    prefix = f'"message": "ack of message {message_id}: '
    return [line.split(prefix, 1)[1].split('"', 1)[0] for line in _lines(worker, prefix)]


def nacks(worker: Worker, message_id: str) -> int:
    """How many times the worker nacked ``message_id``."""
    return worker.log().count(f'"message": "nack of message {message_id} (')


def drops(worker: Worker, message_id: str) -> int:
    """How many times the worker let ``message_id`` go without ack or nack (a stale delivery)."""
    return worker.log().count(f'"message": "drop of message {message_id}"')


def wait_until_let_go(worker: Worker, message_id: str, timeout_s: float = 30) -> None:
    """Wait until the worker acked, nacked or dropped a delivery of ``message_id``."""
    deadline = time.monotonic() + timeout_s
    while not (acks(worker, message_id) or nacks(worker, message_id) or drops(worker, message_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"message {message_id} still held:\n{worker.log()[-4000:]}")
        time.sleep(0.1)


def _lines(worker: Worker, text: str) -> list[str]:
    return [line for line in worker.log().splitlines() if text in line]
