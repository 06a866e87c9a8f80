"""Each outcome's HTTP answer: 2xx exactly for the outcomes that ack; the request's cap."""

from __future__ import annotations

import pytest

from pubsub_worker._worker.outcome import Decision, Outcome
from pubsub_worker.errors import LostOwnership
from pubsub_worker.push.delivery import answer_for, push_settings, request_cap_s
from pubsub_worker.settings import Settings

FINAL = [outcome for outcome in Outcome if outcome is not Outcome.RUN]


@pytest.mark.parametrize("outcome", FINAL, ids=[o.value for o in FINAL])
def test_an_answer_is_2xx_exactly_when_the_outcome_acks(outcome: Outcome) -> None:
    answer = answer_for(Decision(outcome, "why"))
    assert answer.acked is outcome.acks
    assert answer.outcome == outcome.value


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (Outcome.COMPLETE, 200),
        (Outcome.REVIEW, 200),
        (Outcome.ACK, 200),
        (Outcome.RETRY, 500),
        (Outcome.RELEASE, 503),
        (Outcome.DEFER, 503),
        (Outcome.NACK, 503),
        (Outcome.DROP, 409),
    ],
)
def test_the_status_of_each_outcome(outcome: Outcome, status: int) -> None:
    assert answer_for(Decision(outcome, "why")).status == status


def test_a_deferral_says_when_to_come_back() -> None:
    answer = answer_for(Decision(Outcome.DEFER, "busy", delay_s=12.2))
    assert answer.retry_after_s == 13
    assert (b"retry-after", b"13") in answer.headers()


def test_a_lost_nack_is_a_conflict_not_a_retry_later() -> None:
    lost = Decision(Outcome.NACK, "ownership lost", error_type=LostOwnership.__name__)
    assert answer_for(lost).status == 409


@pytest.mark.parametrize(
    ("lease", "cap", "expected"),
    [(10, 480, 8), (60, 480, 50), (600, 3600, 590), (600, 120, 120), (150, 60, 60)],
)
def test_a_request_is_capped_below_its_deadline(lease: int, cap: int, expected: int) -> None:
    settings = Settings(
        subscription="projects/p/subscriptions/jobs",
        lease_seconds=lease,
        max_processing_seconds=max(cap, lease),
    )
    if cap < lease:
        settings = settings.model_copy(update={"max_processing_seconds": cap})
    assert request_cap_s(settings) == expected
    pushed = push_settings(settings)
    assert pushed.max_processing_seconds == expected
    assert pushed.allow_at_least_once is True
    assert pushed.lease_seconds == lease
