"""Crash windows of the core, with real processes and exact effect counts."""

from __future__ import annotations

from typing import Any

import pytest

from emulator import SubscriptionHandle
from tests.support.processes import Effects

pytestmark = [pytest.mark.emulator, pytest.mark.chaos]


def test_sigkill_in_step_b_of_three_resumes_at_step_b(
    publisher: Any,
    eod_subscription: SubscriptionHandle,
    worker_env: dict[str, str],
    effects: Effects,
    workers: Any,
) -> None:
    first = workers({**worker_env, "CHAOS_KILL_AT": "step:b"}, "first")
    publisher.publish(eod_subscription.topic_path, b"payload", op="op-1").result()
    first.process.wait(timeout=60)  # it killed itself inside step b
    assert effects.count("killed") == 1
    assert effects.count("a") == 1
    assert effects.count("b") == 0

    workers(worker_env, "second")
    effects.wait_until("c", 1, timeout_s=60)
    assert effects.by_effect() == {"killed": 1, "a": 1, "b": 1, "c": 1}
