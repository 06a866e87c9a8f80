"""The lease keeper: renew only with progress, abandon past the cap, lose on INVALID_ACK_ID."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from pubsub_worker.deliveries import Delivery
from pubsub_worker.lease import LeaseKeeper
from pubsub_worker.metrics import Counter, Metrics


class FakeJob:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last_progress = self.started
        self.abandoned = threading.Event()
        self.delivery = Delivery("m1", "ack-1", 1, "d1")
        self.key = "k"
        self.message_id = "m1"


class FakeMessage:
    def __init__(self, outcome: BaseException | None = None) -> None:
        self.renewals: list[int] = []
        self.outcome = outcome

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]:
        self.renewals.append(seconds)
        future: Future[Any] = Future()
        if self.outcome is None:
            future.set_result(AcknowledgeStatus.SUCCESS)
        else:
            future.set_exception(self.outcome)
        return future


def keeper(lease_s: float = 10, cap_s: float = 100) -> tuple[LeaseKeeper, Metrics]:
    metrics = Metrics()
    return LeaseKeeper(lease_s=lease_s, max_processing_s=cap_s, metrics=metrics), metrics


def age(job: FakeJob, entry_keeper: LeaseKeeper, seconds: float) -> None:
    """Pretend ``seconds`` passed since the job started and since its last renewal."""
    job.started -= seconds
    job.last_progress -= seconds
    for entry in entry_keeper._entries.values():
        entry.last_renewal -= seconds


def test_no_renewal_without_progress() -> None:
    k, metrics = keeper()
    job, message = FakeJob(), FakeMessage()
    k.track(job, message, time.time())
    age(job, k, 6)  # past half a lease, but no progress since the track
    k.tick()
    assert message.renewals == []
    assert metrics.get(Counter.RENEWALS) == 0


def test_progress_after_half_a_lease_renews_for_one_lease() -> None:
    k, metrics = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    k.track(job, message, time.time())
    age(job, k, 6)
    job.last_progress = time.monotonic()  # a step finished
    k.tick()
    k.tick()  # no new progress: no second renewal
    assert message.renewals == [10]
    assert metrics.get(Counter.RENEWALS) == 1


def test_progress_before_half_a_lease_waits() -> None:
    k, _ = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    k.track(job, message, time.time())
    age(job, k, 2)
    job.last_progress = time.monotonic()
    k.tick()
    assert message.renewals == []


def test_invalid_ack_id_on_renewal_marks_the_delivery_lost() -> None:
    k, metrics = keeper()
    job = FakeJob()
    message = FakeMessage(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, "gone"))
    k.track(job, message, time.time())
    age(job, k, 6)
    job.last_progress = time.monotonic()
    k.tick()
    assert job.delivery.lost.is_set()
    assert metrics.get(Counter.RENEWAL_FAILURES) == 1


def test_other_renewal_errors_do_not_lose_ownership() -> None:
    k, metrics = keeper()
    job = FakeJob()
    message = FakeMessage(AcknowledgeError(AcknowledgeStatus.OTHER, "transient"))
    k.track(job, message, time.time())
    age(job, k, 6)
    job.last_progress = time.monotonic()
    k.tick()
    assert not job.delivery.lost.is_set()
    assert metrics.get(Counter.RENEWAL_FAILURES) == 1


def test_a_job_past_the_cap_is_abandoned_and_no_longer_renewed() -> None:
    k, metrics = keeper(lease_s=10, cap_s=30)
    job, message = FakeJob(), FakeMessage()
    k.track(job, message, time.time())
    age(job, k, 31)
    job.last_progress = time.monotonic()
    k.tick()
    assert job.abandoned.is_set()
    assert message.renewals == []
    assert metrics.get(Counter.ABANDONED) == 1


def test_gauges_follow_the_jobs_in_flight() -> None:
    k, _ = keeper()
    job = FakeJob()
    k.track(job, FakeMessage(), time.time() - 42)
    assert k.in_flight() == 1
    assert 41 <= k.oldest_age_s() <= 44
    k.untrack(job)
    assert (k.in_flight(), k.oldest_age_s()) == (0, 0.0)


def test_start_and_stop_are_idempotent() -> None:
    k, _ = keeper()
    k.start()
    k.start()
    names = [t.name for t in threading.enumerate()]
    assert names.count("pubsub-worker-lease-keeper") == 1
    k.stop()
    k.stop()
    assert "pubsub-worker-lease-keeper" not in [t.name for t in threading.enumerate()]
