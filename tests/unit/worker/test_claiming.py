"""How long a delivery polls another owner's live lease before it defers."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._job.claim import Claim, ClaimKind
from pubsub_worker._worker import claiming
from pubsub_worker._worker.outcome import Happened


class _Clock:
    """A monotonic clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _polls(monkeypatch: pytest.MonkeyPatch, *, lease_s: int, cap_s: int) -> tuple[int, float]:
    """Claims sent against an owner whose lease runs 30 s more, and the time spent polling."""
    clock = _Clock()
    monkeypatch.setattr(claiming, "time", clock)
    claims: list[float] = []

    def busy_claim(store: Any, request: Any, *, exists_hint: bool = False) -> Claim:
        claims.append(clock.now)
        return Claim(ClaimKind.BUSY, busy_for_s=30.0)

    monkeypatch.setattr(claiming, "claim", busy_claim)
    rt: Any = SimpleNamespace(
        settings=SimpleNamespace(lease_seconds=lease_s, max_processing_seconds=cap_s),
        tracker=SimpleNamespace(is_current=lambda delivery: True),
        draining=threading.Event(),
        context=SimpleNamespace(stopping=threading.Event()),
        metrics=SimpleNamespace(inc=lambda *args, **kwargs: None),
        store=None,
    )
    start = clock.now
    delivery = Delivery("m1", "ack", 1, "digest", deadline=clock.now + cap_s)  # received now
    got = claiming.claim_job(rt, request=None, message=None, delivery=delivery, redelivery=False)  # type: ignore[arg-type]
    assert isinstance(got, Happened)
    assert got.claim is ClaimKind.BUSY
    return len(claims), clock.now - start


def test_a_busy_owner_is_polled_once_a_second_for_the_busy_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pull: a 60 s lease and an 8-minute cap; the wait is BUSY_WAIT_S (10 s).
    assert _polls(monkeypatch, lease_s=60, cap_s=480) == (10, 9.0)


def test_the_busy_wait_ends_while_enough_of_the_processing_cap_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Push: a 10 s deadline leaves an 8 s cap, of which a claim needs 2 s (a quarter) left;
    # a claim won later would be released at once (an attempt spent): the poll gives up
    # after 5 s, its sixth claim at most 6 s after receipt.
    assert _polls(monkeypatch, lease_s=10, cap_s=8) == (6, 5.0)


def test_a_delivery_received_too_long_ago_is_not_claimed_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(claiming, "time", clock)
    monkeypatch.setattr(claiming, "claim", lambda *args, **kwargs: pytest.fail("claimed"))
    rt: Any = SimpleNamespace(settings=SimpleNamespace(lease_seconds=10, max_processing_seconds=8))
    delivery = Delivery("m1", "ack", 1, "digest", deadline=clock.now + 1.5)  # 6.5 s in a queue
    got = claiming.claim_job(rt, request=None, message=None, delivery=delivery, redelivery=False)  # type: ignore[arg-type]
    assert isinstance(got, Happened)
    assert got.phase.value == "gate"
    assert "too little of its processing cap" in str(got.error)
