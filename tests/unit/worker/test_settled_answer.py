"""A delivery's settlement as a future, made only when asked for."""

from __future__ import annotations

from pubsub_worker._worker.outcome import Decision, Outcome, Settled
from pubsub_worker._worker.settle import SettledAnswer


def test_a_future_asked_for_before_the_settlement_resolves_with_it() -> None:
    answer = SettledAnswer()
    future = answer.future()
    assert not future.done()
    settled = Settled(Decision(Outcome.COMPLETE, "done"), "SUCCESS")
    answer.set(settled)
    assert future.result(timeout=0) is settled
    assert answer.future() is future


def test_a_future_asked_for_after_the_settlement_is_resolved_at_once() -> None:
    answer = SettledAnswer()
    settled = Settled(Decision(Outcome.DEFER, "later"))
    answer.set(settled)
    future = answer.future()
    assert future.result(timeout=0) is settled
    assert answer.future() is future
