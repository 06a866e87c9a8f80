"""Leases judged on Firestore's clock: a worker whose wall clock is a minute off, real processes.

One of two worker processes runs with its wall clock shifted by 60 s
(libfaketime, ``LD_PRELOAD``; the monotonic clock is left alone, as it is
on a real machine whose wall clock is wrong). A lease is live while the job
document's update time plus ``lease_seconds`` is after the read time, both
on the server's clock, so the shift must change nothing:

* a job whose owner keeps committing steps is never taken over, whichever
  of the two clocks is off (with wall-clock leases, a clock 60 s ahead, or
  an owner 60 s behind, took it over at once);
* once the owner froze, the job is taken over one lease after its last
  write, not one lease plus the skew (with wall-clock leases, a rescuer 60 s
  behind, or an owner 60 s ahead, waited 70 s).

Effects are counted exactly (``tests/support/worker.py``, steps ``a``, ``b``,
``c``), and each test first checks that the shift really took hold in the
skewed process: its log timestamps run 60 s off the test's clock.

Needs the Debian package ``faketime`` (``libfaketime.so.1``): skipped
locally without it, a failure in CI. libfaketime 0.9.10 (Debian 12) breaks
one call with ``FAKETIME_DONT_FAKE_MONOTONIC=1``: an absolute
``clock_nanosleep`` on ``CLOCK_MONOTONIC`` fails with ``EINVAL``, and that is
how ``time.sleep`` sleeps from Python 3.11 on. A ``sitecustomize`` given to
the skewed worker only makes ``time.sleep`` wait in ``select()`` instead;
everything else (gRPC, locks, events, queues with timeouts) was checked to
work under libfaketime as it is. Faking the monotonic clock too is no way
out: every timed lock, event and queue wait then hangs.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from glob import glob
from pathlib import Path
from typing import Any

import pytest

from emulator import Emulators, SubscriptionHandle, TcpProxy
from emulator.pytest_plugin import running_in_ci
from tests.chaos.conftest import LEASE_S
from tests.support.gate import Gate
from tests.support.observe import acks, end_stale_streams, job_document, runs, step_epochs
from tests.support.processes import Effects, Worker

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]

SKEW_S = 60
"""How far the skewed worker's wall clock is off, either way."""
STEP_SLEEP_S = 6
"""Each step of the live owner takes this long: a commit every 6 s keeps a 10 s lease live."""
TAKE_OVER_BOUND_S = LEASE_S + 40
"""A frozen owner's job is completed by the rescuer within this long of the owner's last write.

One lease until the job and the message come back, one deferral (10 s) if
the message came back a moment before the lease ran out, plus start-up and
delivery slack on a loaded machine. Judged on the wall clock, the take-over
could not come before ``LEASE_S + SKEW_S``.
"""
assert TAKE_OVER_BOUND_S < LEASE_S + SKEW_S

_LIBFAKETIME = "libfaketime.so.1"
_INSTALL = "apt-get install -y faketime"


def _libfaketime() -> str:
    """The path of libfaketime, or skip (fail in CI) saying how to install it."""
    found = sorted(
        glob(f"/usr/lib/*/faketime/{_LIBFAKETIME}") + glob(f"/usr/lib/faketime/{_LIBFAKETIME}")
    )
    if found:
        return found[0]
    why = f"{_LIBFAKETIME} not found: the clock-skew tests need libfaketime ({_INSTALL})"
    if running_in_ci():
        pytest.fail(why)
    pytest.skip(why)


_SLEEP_SHIM = '''"""time.sleep through select(): libfaketime 0.9.10 breaks Python's sleep."""
import select
import time


def _sleep(seconds):
    select.select([], [], [], seconds)


time.sleep = _sleep
'''


def shifted(env: dict[str, str], seconds: int, shim_dir: Path) -> dict[str, str]:
    """``env`` for a worker whose wall clock runs ``seconds`` off; monotonic time is real."""
    shim_dir.mkdir(exist_ok=True)
    (shim_dir / "sitecustomize.py").write_text(_SLEEP_SHIM)
    path = os.pathsep.join(p for p in (str(shim_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **env,
        "LD_PRELOAD": _libfaketime(),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": path,
    }


def received(worker: Worker, message_id: str, timeout_s: float = 60) -> float:
    """Wait until ``worker`` is handed ``message_id``; how far its clock is off ours, in s."""
    text = f"received message {message_id}"
    worker.wait_for_log(text, timeout_s=timeout_s)
    seen = datetime.now(timezone.utc)
    line = next(line for line in worker.log().splitlines() if text in line)
    logged = datetime.fromisoformat(json.loads(line)["time"])
    return (logged - seen).total_seconds()


def assert_off_by(offset_s: float, expected_s: int) -> None:
    """The worker's clock was ``expected_s`` off ours (we may read its log line a little late)."""
    assert expected_s - 10 <= offset_s <= expected_s + 2, (offset_s, expected_s)


@pytest.mark.parametrize(
    ("skewed", "skew_s"),
    [("other", +SKEW_S), ("owner", -SKEW_S)],
    ids=["other-ahead", "owner-behind"],
)
def test_a_skewed_clock_never_takes_a_live_job_over(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
    skewed: str,
    skew_s: int,
    tmp_path: Path,
) -> None:
    """A duplicate of a running job reaches the other worker while the owner makes progress.

    The owner runs three 6 s steps; each commit renews its 10 s lease. Its
    Pub/Sub connection is blackholed once it has the message, so the
    duplicate (same key, same payload, new message id) and later the
    redelivery of the first message can only reach the other worker. That
    worker finds the job busy, whatever its clock says, until the owner
    completes it; then it acks both messages without running anything.
    """
    topic, sub_path = eod_subscription.topic_path, eod_subscription.subscription_path
    with TcpProxy(emulators.pubsub_host or "") as owner_link:
        owner_env = {
            **worker_env,
            "PUBSUB_EMULATOR_HOST": owner_link.address,
            "CHAOS_STEP_SLEEP_S": str(STEP_SLEEP_S),
        }
        other_env = dict(worker_env)
        if skewed == "owner":
            owner_env = shifted(owner_env, skew_s, tmp_path / "faketime")
        else:
            other_env = shifted(other_env, skew_s, tmp_path / "faketime")
        owner = workers(owner_env, "owner")
        first_id = publisher.publish(topic, b"payload", op="op-1").result()
        owner_offset_s = received(owner, first_id)
        # The owner keeps its Firestore connection (it commits its steps) but nothing
        # more reaches it from Pub/Sub; its stream at the emulator is ended too.
        owner_link.blackhole()
        end_stale_streams(subscriber, sub_path)

        other = workers(other_env, "other")
        second_id = publisher.publish(topic, b"payload", op="op-1").result()
        other_offset_s = received(other, second_id)
        assert effects.count("c") == 0, "the owner finished before the duplicate arrived"
        other.wait_for_log(f"ack of message {second_id}: SUCCESS", timeout_s=90)
        other.wait_for_log(f"ack of message {first_id}: SUCCESS", timeout_s=90)
        owner.kill()
        other.kill()

    assert_off_by(owner_offset_s, skew_s if skewed == "owner" else 0)
    assert_off_by(other_offset_s, skew_s if skewed == "other" else 0)
    assert "Invalid argument" not in (owner if skewed == "owner" else other).log()
    assert effects.by_effect() == {"a": 1, "b": 1, "c": 1}
    assert runs(effects, "a") == runs(effects, "b") == runs(effects, "c") == [(owner.pid, 1)]
    assert acks(other, first_id) == acks(other, second_id) == ["SUCCESS"]
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 1, 1)
    assert doc["lease_seconds"] == LEASE_S
    assert step_epochs(doc) == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize(
    ("skewed", "skew_s"),
    [("rescuer", -SKEW_S), ("owner", +SKEW_S)],
    ids=["rescuer-behind", "owner-ahead"],
)
def test_a_skewed_clock_takes_an_expired_job_over_one_lease_after_the_last_write(
    emulators: Emulators,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    firestore_collection: str,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
    skewed: str,
    skew_s: int,
    tmp_path: Path,
) -> None:
    """The owner freezes (SIGSTOP) inside step b; the rescuer completes the job in time.

    Step a is the owner's last write. One lease later by the server's clock
    the job is free: the rescuer takes it over at epoch 2, skips a, runs b
    and c, and acks, well before a 60 s skew could have run out.
    """
    topic, sub_path = eod_subscription.topic_path, eod_subscription.subscription_path
    with TcpProxy(emulators.pubsub_host or "") as owner_link:
        owner_env = {
            **worker_env,
            "PUBSUB_EMULATOR_HOST": owner_link.address,
            "CHAOS_GATES": "step:b",
        }
        rescuer_env = dict(worker_env)
        if skewed == "owner":
            owner_env = shifted(owner_env, skew_s, tmp_path / "faketime")
        else:
            rescuer_env = shifted(rescuer_env, skew_s, tmp_path / "faketime")
        owner = workers(owner_env, "owner")
        message_id = publisher.publish(topic, b"payload", op="op-1").result()
        owner_offset_s = received(owner, message_id)
        gate = Gate(effects.path, "step:b")
        assert gate.wait_arrived() == owner.pid  # step a is committed: the last write
        last_write = time.monotonic()
        owner.pause()
        gate.release()  # takes effect if the process is ever resumed; it is not
        owner_link.cut()  # a frozen process cannot reconnect; the rescuer gets the redelivery
        end_stale_streams(subscriber, sub_path)

        rescuer = workers(rescuer_env, "rescuer")
        rescuer_offset_s = received(rescuer, message_id)
        budget_s = last_write + TAKE_OVER_BOUND_S - time.monotonic()
        rescuer.wait_for_log(f"ack of message {message_id}: SUCCESS", timeout_s=budget_s)
        owner.kill()
        rescuer.kill()

    assert_off_by(owner_offset_s, skew_s if skewed == "owner" else 0)
    assert_off_by(rescuer_offset_s, skew_s if skewed == "rescuer" else 0)
    assert "Invalid argument" not in (owner if skewed == "owner" else rescuer).log()
    assert effects.by_effect() == {"a": 1, "b": 1, "c": 1}
    assert runs(effects, "a") == [(owner.pid, 1)]
    assert runs(effects, "b") == runs(effects, "c") == [(rescuer.pid, 2)]
    assert acks(rescuer, message_id) == ["SUCCESS"]
    doc = job_document(firestore_client, firestore_collection, sub_path, "op-1")
    assert (doc["status"], doc["epoch"], doc["attempts"]) == ("completed", 2, 2)
    assert step_epochs(doc) == {"a": 1, "b": 2, "c": 2}
