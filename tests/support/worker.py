"""A real worker process for crash-window tests: ``python -m tests.support.worker``.

Configured by ``PUBSUB_WORKER_*`` (the library's own settings) plus:

``CHAOS_EFFECTS``   file that every effect appends one JSON line to (O_APPEND, fsync)
``CHAOS_SCENARIO``  ``steps`` (default: steps a, b, c), ``always_fail``, ``permanent``,
                    ``redelivered_in_b`` (steps a, b, c; inside b at epoch 1 the message's
                    deadline is set to 0, so Pub/Sub redelivers it while b runs),
                    ``outbox`` (step ``produce`` publishes to ``CHAOS_OUTPUT_TOPIC``),
                    ``transactional`` (transactional step ``write`` adds a document to
                    ``CHAOS_SINK_COLLECTION`` and, with ``CHAOS_OUTPUT_TOPIC``, publishes),
                    ``fenced`` (step ``write`` writes ``samples.fenced_sink`` at the epoch),
                    ``callback`` (an unchanged ``callback(message)`` that acks),
                    ``callback_steps`` (the same, running steps a, b, c through ``message.job``),
                    ``outbox_swallow`` (like ``outbox``, swallowing every error of its step),
                    ``publish_outside`` (``job.publish()`` outside any step),
                    ``big`` (``CHAOS_STEPS`` steps ``s1``.. of ``CHAOS_RESULT_BYTES`` each),
                    ``permanent_surrogate`` / ``fail_surrogate`` (``PermanentError`` / a plain
                    error whose message holds a file name with a lone surrogate),
                    ``permanent_in_step`` (step ``a`` raises ``PermanentError``),
                    ``outbox_permanent`` (step ``produce`` publishes to ``CHAOS_OUTPUT_TOPIC``,
                    then, past the gate ``before_raise``, ``PermanentError``),
                    ``permanent_first`` (step ``a``, then ``PermanentError`` at epoch 1 and
                    step ``b`` at any later epoch)
``CHAOS_KILL_AT``   SIGKILL this process once (a marker file remembers) at a named point
                    (through the library's :class:`~pubsub_worker.hooks.Hooks`):
                    ``step:NAME`` inside step NAME; ``before_ack`` after the completion
                    record, before the ack; ``before_publish`` after an outbox entry is
                    committed, before it is published; ``after_publish`` after the outbox
                    publish, before the completion
``CHAOS_STEP_SLEEP_S``  seconds each step sleeps (widens pause windows); only the steps in
                    ``CHAOS_SLEEP_STEPS`` and epochs in ``CHAOS_SLEEP_EPOCHS`` if set (commas)
``CHAOS_HEARTBEAT`` ``1``: a sleeping step calls ``job.heartbeat()`` every 0.2 s
``CHAOS_PLAIN_SLEEP_S``  seconds the ``steps`` handler sleeps after step ``a``, outside any step
                    (in the epochs of ``CHAOS_SLEEP_EPOCHS`` if set)
``CHAOS_ASYNC``     ``1``: the ``async def`` version of the scenario (``steps``,
                    ``always_fail``, ``permanent``, ``outbox``, ``transactional``, ``callback``)
``CHAOS_GATES``     comma-separated points (``step:NAME``, ``end`` after the last step of
                    ``steps``, ``before_ack`` after the completion record, before the ack:
                    on the completer, the callback thread free; ``before_review`` in the
                    failure path, ownership confirmed, nothing recorded or published yet)
                    where this worker holds, once per test, until the test releases it
                    (:mod:`tests.support.gate`)
``CHAOS_STORE``     ``plain`` (``FirestoreJobStore``) or ``batching``
                    (``BatchingFirestoreJobStore``) instead of the wrapper's default store, built
                    with ``CHAOS_STORE_RPC_TIMEOUT_S`` (default 10) as its per-RPC timeout, so a
                    blackholed call fails fast

Each effect line: ``{"effect": step, "key": job key, "epoch": n, "pid": pid, "at": unix time}``.
Every delivery handed to the wrapper is logged as ``received message ID``, and what became
of it as ``ack of message ID: SUCCESS`` (or the refusal), ``nack of message ID``, ``drop of
message ID`` (logger ``chaos``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pubsub_worker
from pubsub_worker._job.async_job import AsyncJob
from pubsub_worker._support.logs import configure
from pubsub_worker.hooks import Hooks
from tests.support import gate
from tests.support.production import production_acks


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


EFFECTS = _env("CHAOS_EFFECTS")
KILL_AT = _env("CHAOS_KILL_AT")
SCENARIO = _env("CHAOS_SCENARIO", "steps")
SLEEP_S = float(_env("CHAOS_STEP_SLEEP_S", "0") or 0)
HEARTBEAT = _env("CHAOS_HEARTBEAT") == "1"
ASYNC = _env("CHAOS_ASYNC") == "1"
SLEEP_STEPS = frozenset(name for name in _env("CHAOS_SLEEP_STEPS").split(",") if name)
SLEEP_EPOCHS = frozenset(int(n) for n in _env("CHAOS_SLEEP_EPOCHS").split(",") if n)
GATES = frozenset(point for point in _env("CHAOS_GATES").split(",") if point)
PLAIN_SLEEP_S = float(_env("CHAOS_PLAIN_SLEEP_S", "0") or 0)


def effect(name: str, key: str, epoch: int, **extra: Any) -> None:
    """Record one externally visible effect, durably, before returning."""
    record = {"effect": name, "key": key, "epoch": epoch, "pid": os.getpid(), "at": time.time()}
    line = json.dumps({**record, **extra})
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def maybe_die(point: str) -> None:
    """SIGKILL this process the first time ``point`` is reached, if asked to."""
    marker = EFFECTS + ".killed"
    if point == KILL_AT and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(str(os.getpid()))
        effect("killed", point, 0)
        os.kill(os.getpid(), signal.SIGKILL)


class ChaosHooks(Hooks):
    """Kill points and a log of what became of every delivery, through the library's hooks."""

    def received(self, message_id: str) -> None:
        _CHAOS_LOG.info("received message %s", message_id)

    def before_publish(self, key: str, step: str, entry_id: str) -> None:
        maybe_die("before_publish")

    def after_publish(self, key: str, step: str, entry_id: str) -> None:
        maybe_die("after_publish")

    def before_review(self, key: str | None, message_id: str) -> None:
        if "before_review" in GATES:
            gate.hold(EFFECTS, "before_review")

    def before_ack(self, key: str | None, message_id: str) -> None:
        maybe_die("before_ack")
        if "before_ack" in GATES:
            gate.hold(EFFECTS, "before_ack")  # the completion is durable; the ack not sent

    def settled(self, message_id: str, outcome: str, answer: str | None) -> None:
        if answer is not None:
            _CHAOS_LOG.info("ack of message %s: %s", message_id, answer)
        elif outcome == "drop":
            _CHAOS_LOG.info("drop of message %s", message_id)
        else:
            _CHAOS_LOG.info("nack of message %s (%s)", message_id, outcome)


def _step(job: pubsub_worker.Job, name: str) -> str:
    def run() -> str:
        maybe_die(f"step:{name}")
        if f"step:{name}" in GATES:
            gate.hold(EFFECTS, f"step:{name}")
        if SLEEP_S and _sleeps(name, job.epoch):
            deadline = time.monotonic() + SLEEP_S
            while time.monotonic() < deadline:
                time.sleep(0.2)
                if HEARTBEAT:
                    job.heartbeat()
        effect(name, job.key, job.epoch)
        return f"{name}-done"

    return job.step(name, run)


def _sleeps(step: str, epoch: int) -> bool:
    return (not SLEEP_STEPS or step in SLEEP_STEPS) and (not SLEEP_EPOCHS or epoch in SLEEP_EPOCHS)


def handle_steps(message: Any, job: pubsub_worker.Job) -> None:
    for name in ("a", "b", "c"):
        _step(job, name)
        if name == "a" and PLAIN_SLEEP_S and _sleeps("a", job.epoch):
            time.sleep(PLAIN_SLEEP_S)  # plain handler code between steps: no job call
    if "end" in GATES:
        gate.hold(EFFECTS, "end")  # the work is done; the handler has not returned yet


decorated_steps = pubsub_worker.exactly_once(handle_steps)
"""``handle_steps`` as the README teaches it: decorated (``pubsub-worker push`` serves it too)."""


def handle_redelivered_in_b(message: Any, job: pubsub_worker.Job) -> None:
    """Steps a, b, c; at epoch 1, inside b, the message's deadline is set to 0 (as when its
    lease lapses without any fault of this process: Pub/Sub redelivers it here at once),
    and b goes on for 3 s with heartbeats before its effect."""

    def b() -> str:
        if job.epoch == 1:
            effect("deadline-0", job.key, job.epoch)
            message.modify_ack_deadline(0)
            for _ in range(15):
                time.sleep(0.2)
                job.heartbeat()
        effect("b", job.key, job.epoch)
        return "b-done"

    _step(job, "a")
    job.step("b", b)
    _step(job, "c")


def handle_always_fail(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise RuntimeError("this job always fails")


def handle_permanent(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise pubsub_worker.PermanentError("payload can never be processed")


def handle_permanent_first(message: Any, job: pubsub_worker.Job) -> None:
    _step(job, "a")
    if job.epoch == 1:
        effect("raise", job.key, job.epoch)
        raise pubsub_worker.PermanentError("payload can never be processed (at epoch 1)")
    _step(job, "b")


def handle_outbox(message: Any, job: pubsub_worker.Job) -> None:
    topic = _env("CHAOS_OUTPUT_TOPIC")

    def produce() -> str:
        effect("produce", job.key, job.epoch)
        job.publish(topic, b"output:" + message.data, source="chaos")
        return "produced"

    job.step("produce", produce)


def handle_outbox_swallow(message: Any, job: pubsub_worker.Job) -> None:
    """A handler that swallows every error of its step (a publish that failed, say)."""
    topic = _env("CHAOS_OUTPUT_TOPIC")

    def produce() -> str:
        effect("produce", job.key, job.epoch)
        job.publish(topic, b"output:" + message.data, source="chaos")
        return "produced"

    try:
        job.step("produce", produce)
    except Exception as exc:
        effect("swallowed", job.key, job.epoch, error=repr(exc))


def handle_publish_outside(message: Any, job: pubsub_worker.Job) -> None:
    """``job.publish()`` outside any step: a step of its own."""
    effect("publish", job.key, job.epoch)
    job.publish(_env("CHAOS_OUTPUT_TOPIC"), b"output:" + message.data, source="chaos")


def handle_big(message: Any, job: pubsub_worker.Job) -> None:
    """``CHAOS_STEPS`` steps, each returning ``CHAOS_RESULT_BYTES`` bytes of result."""
    size = int(_env("CHAOS_RESULT_BYTES", "1000"))
    for index in range(1, int(_env("CHAOS_STEPS", "3")) + 1):
        name = f"s{index}"

        def run(name: str = name) -> str:
            effect(name, job.key, job.epoch)
            return "x" * size

        job.step(name, run)


def handle_callback_steps(message: Any) -> None:
    """An unchanged ``callback(message)`` with steps through ``message.job``, then ack."""
    for name in ("a", "b", "c"):
        _step(message.job, name)
    message.ack()


def handle_transactional(message: Any, job: pubsub_worker.Job) -> None:
    collection = _env("CHAOS_SINK_COLLECTION")
    topic = _env("CHAOS_OUTPUT_TOPIC")
    client = _firestore()
    if "step:write" in GATES:
        gate.hold(EFFECTS, "step:write")  # before the transaction: a pause here holds no lock

    def write(transaction: Any) -> str:
        # A new document id per attempt: a second landing would show as a second document.
        ref = client.collection(collection).document()
        transaction.set(ref, {"key": job.key, "epoch": job.epoch, "pid": os.getpid()})
        if topic:
            job.publish(topic, b"output:" + message.data, source="chaos")
        return str(ref.id)

    job.transactional_step("write", write)
    effect("write", job.key, job.epoch)


def handle_fenced(message: Any, job: pubsub_worker.Job) -> None:
    from samples.fenced_sink import FencedSink, StaleEpoch

    sink = FencedSink(_firestore(), _env("CHAOS_SINK_COLLECTION"))

    def write() -> str:
        if "step:write" in GATES:
            gate.hold(EFFECTS, "step:write")
        try:
            sink.write(job.key, {"pid": os.getpid()}, epoch=job.epoch)
        except StaleEpoch as exc:  # a LostOwnership: the job stops without an ack
            effect("refused", job.key, job.epoch, seen=exc.seen)
            raise
        effect("write", job.key, job.epoch)
        return "written"

    job.step("write", write)


_CLIENTS: dict[str, Any] = {}


def _firestore() -> Any:
    """One Firestore client per process, for the sink scenarios."""
    if "firestore" not in _CLIENTS:
        from google.cloud import firestore

        _CLIENTS["firestore"] = firestore.Client()
    return _CLIENTS["firestore"]


def handle_callback(message: Any) -> None:
    effect("callback", message.message_id, 0)
    message.ack()


BAD_FILE_NAME = os.fsdecode(b"report-\xff.csv")
"""A file name as ``os.fsdecode`` gives it for undecodable bytes: a lone surrogate."""


def handle_permanent_surrogate(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise pubsub_worker.PermanentError(f"bad file {BAD_FILE_NAME}")


def handle_fail_surrogate(message: Any, job: pubsub_worker.Job) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt)
    raise RuntimeError(f"bad file {BAD_FILE_NAME}")


def handle_permanent_in_step(message: Any, job: pubsub_worker.Job) -> None:
    def run() -> str:
        if "step:a" in GATES:
            gate.hold(EFFECTS, "step:a")
        effect("a", job.key, job.epoch)
        raise pubsub_worker.PermanentError("payload can never be processed")

    job.step("a", run)


def handle_outbox_permanent(message: Any, job: pubsub_worker.Job) -> None:
    topic = _env("CHAOS_OUTPUT_TOPIC")

    def produce() -> str:
        effect("produce", job.key, job.epoch)
        job.publish(topic, b"output:" + message.data, source="chaos")
        return "produced"

    job.step("produce", produce)
    if "before_raise" in GATES:
        gate.hold(EFFECTS, "before_raise")
    effect("raise", job.key, job.epoch)
    raise pubsub_worker.PermanentError("payload can never be processed")


HANDLERS: dict[str, Callable[..., None]] = {
    "steps": handle_steps,
    "redelivered_in_b": handle_redelivered_in_b,
    "always_fail": handle_always_fail,
    "permanent": handle_permanent,
    "outbox": handle_outbox,
    "transactional": handle_transactional,
    "fenced": handle_fenced,
    "callback": handle_callback,
    "callback_steps": handle_callback_steps,
    "outbox_swallow": handle_outbox_swallow,
    "publish_outside": handle_publish_outside,
    "big": handle_big,
    "permanent_surrogate": handle_permanent_surrogate,
    "fail_surrogate": handle_fail_surrogate,
    "permanent_in_step": handle_permanent_in_step,
    "outbox_permanent": handle_outbox_permanent,
    "permanent_first": handle_permanent_first,
}


# -- the same scenarios as ``async def`` handlers (``CHAOS_ASYNC=1``) ---------------


async def _astep(job: AsyncJob, name: str) -> str:
    async def run() -> str:
        maybe_die(f"step:{name}")
        if f"step:{name}" in GATES:
            await asyncio.to_thread(gate.hold, EFFECTS, f"step:{name}")
        if SLEEP_S and _sleeps(name, job.epoch):
            deadline = time.monotonic() + SLEEP_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                if HEARTBEAT:
                    await job.heartbeat()
        effect(name, job.key, job.epoch, flavour="async")
        return f"{name}-done"

    return await job.step(name, run)


async def ahandle_steps(message: Any, job: AsyncJob) -> None:
    for name in ("a", "b", "c"):
        await _astep(job, name)
    if "end" in GATES:
        await asyncio.to_thread(gate.hold, EFFECTS, "end")


async def ahandle_always_fail(message: Any, job: AsyncJob) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt, flavour="async")
    raise RuntimeError("this job always fails")


async def ahandle_permanent(message: Any, job: AsyncJob) -> None:
    effect("attempt", job.key, job.epoch, attempt=job.attempt, flavour="async")
    raise pubsub_worker.PermanentError("payload can never be processed")


async def ahandle_outbox(message: Any, job: AsyncJob) -> None:
    topic = _env("CHAOS_OUTPUT_TOPIC")

    async def produce() -> str:
        effect("produce", job.key, job.epoch, flavour="async")
        job.publish(topic, b"output:" + message.data, source="chaos")
        return "produced"

    await job.step("produce", produce)


async def ahandle_transactional(message: Any, job: AsyncJob) -> None:
    from google.cloud import firestore

    collection = _env("CHAOS_SINK_COLLECTION")
    topic = _env("CHAOS_OUTPUT_TOPIC")
    if "async_firestore" not in _CLIENTS:
        _CLIENTS["async_firestore"] = firestore.AsyncClient()
    client = _CLIENTS["async_firestore"]
    if "step:write" in GATES:
        await asyncio.to_thread(gate.hold, EFFECTS, "step:write")

    async def write(transaction: Any) -> str:
        ref = client.collection(collection).document()
        transaction.set(ref, {"key": job.key, "epoch": job.epoch, "pid": os.getpid()})
        if topic:
            job.publish(topic, b"output:" + message.data, source="chaos")
        return str(ref.id)

    await job.transactional_step("write", write)
    effect("write", job.key, job.epoch, flavour="async")


async def ahandle_callback(message: Any) -> None:
    effect("callback", message.message_id, 0, flavour="async")
    message.ack()


ASYNC_HANDLERS: dict[str, Callable[..., Any]] = {
    "steps": ahandle_steps,
    "always_fail": ahandle_always_fail,
    "permanent": ahandle_permanent,
    "outbox": ahandle_outbox,
    "transactional": ahandle_transactional,
    "callback": ahandle_callback,
}


def main() -> int:
    configure("json", logging.INFO)
    production_acks()
    logging.getLogger("google").setLevel(logging.WARNING)
    print(json.dumps({"worker": "ready", "pid": os.getpid()}), flush=True)
    handler = ASYNC_HANDLERS[SCENARIO] if ASYNC else HANDLERS[SCENARIO]
    return pubsub_worker.run(handler, hooks=ChaosHooks(), **_store_options())


_CHAOS_LOG = logging.getLogger("chaos")


def _store_options() -> dict[str, Any]:
    """The job store ``CHAOS_STORE`` names, with ``CHAOS_STORE_RPC_TIMEOUT_S``; else the default."""
    kind = _env("CHAOS_STORE")
    if not kind:
        return {}
    from google.cloud import firestore

    from pubsub_worker.stores.batching import BatchingFirestoreJobStore
    from pubsub_worker.stores.firestore import FirestoreJobStore

    store_class = {"plain": FirestoreJobStore, "batching": BatchingFirestoreJobStore}[kind]
    settings = pubsub_worker.Settings.from_env()
    client = firestore.Client(project=settings.project_id)
    timeout_s = float(_env("CHAOS_STORE_RPC_TIMEOUT_S", "10"))
    return {"store": store_class(client, settings.collection, rpc_timeout_s=timeout_s)}


if __name__ == "__main__":
    sys.exit(main())
