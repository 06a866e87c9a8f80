"""The lease keeper: watch from receipt, renew running jobs only with progress, give up stalls."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from pubsub_worker._delivery.generations import Delivery
from pubsub_worker._delivery.lease import LeaseKeeper, Ticket
from pubsub_worker._support.metrics import Counter, Metrics

T0 = 1000.0  # a monotonic instant; every test passes its clock to attach() and tick()


class FakeJob:
    def __init__(self) -> None:
        self.last_progress = T0
        self.abandoned = False
        self.unsent_count = 0
        self.held = False
        self.settling = False
        self.store_lease_due = False
        self.kept_alive = threading.Semaphore(0)

    def keep_alive(self) -> None:
        self.kept_alive.release()


class FakeMessage:
    def __init__(self, outcome: BaseException | None = None) -> None:
        self.renewals: list[int] = []
        self.dropped = 0
        self.outcome = outcome

    def modify_ack_deadline_with_response(self, seconds: int) -> Future[Any]:
        self.renewals.append(seconds)
        future: Future[Any] = Future()
        if self.outcome is None:
            future.set_result(AcknowledgeStatus.SUCCESS)
        else:
            future.set_exception(self.outcome)
        return future

    def drop(self) -> None:
        self.dropped += 1


def keeper(lease_s: float = 10, cap_s: float = 100) -> tuple[LeaseKeeper, Metrics]:
    metrics = Metrics()
    return LeaseKeeper(lease_s=lease_s, max_processing_s=cap_s, metrics=metrics), metrics


def watched(
    k: LeaseKeeper, message: FakeMessage, job: FakeJob | None = None
) -> tuple[Ticket, Delivery]:
    delivery = Delivery("m1", "ack-1", 1, "d1")
    ticket = k.watch(message, delivery, received_at=T0, published_at=time.time(), key="k")
    if job is not None:
        k.attach(ticket, job, "k", now=T0)  # claimed at once
    return ticket, delivery


def test_a_waiting_message_is_renewed_every_half_lease_without_progress() -> None:
    """Waiting for a thread, the key gate or a busy owner is the worker's doing, not a stall."""
    k, metrics = keeper(lease_s=10)
    message = FakeMessage()
    watched(k, message)
    k.tick(T0 + 4)
    assert message.renewals == []
    k.tick(T0 + 5)
    k.tick(T0 + 9)
    k.tick(T0 + 10)
    assert message.renewals == [10, 10]
    assert message.dropped == 0
    assert metrics.get(Counter.RENEWALS) == 2


def test_no_renewal_of_a_running_job_without_progress() -> None:
    k, metrics = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    watched(k, message, job)
    k.tick(T0 + 6)  # past half a lease, but no progress since the claim
    assert message.renewals == []
    assert metrics.get(Counter.RENEWALS) == 0


def test_progress_after_half_a_lease_renews_for_one_lease() -> None:
    k, metrics = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    watched(k, message, job)
    job.last_progress = T0 + 5.5  # a step finished
    k.tick(T0 + 6)
    k.tick(T0 + 7)  # no new progress: no second renewal
    assert message.renewals == [10]
    assert metrics.get(Counter.RENEWALS) == 1


def test_steady_heartbeats_keep_a_job_for_many_leases() -> None:
    """A job that reports progress keeps its delivery however long it runs, up to the cap."""
    k, _ = keeper(lease_s=10, cap_s=100)
    job, message = FakeJob(), FakeMessage()
    _, delivery = watched(k, message, job)
    for second in range(1, 95):
        job.last_progress = T0 + second - 0.5
        k.tick(T0 + second)
    assert len(message.renewals) == 94 // 5
    assert not delivery.lost
    assert message.dropped == 0
    assert not job.abandoned


def test_progress_before_half_a_lease_waits() -> None:
    k, _ = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    watched(k, message, job)
    job.last_progress = T0 + 1.5
    k.tick(T0 + 2)
    assert message.renewals == []


def test_a_job_without_progress_for_a_lease_is_given_up() -> None:
    k, metrics = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    _, delivery = watched(k, message, job)
    k.tick(T0 + 9.9)
    assert message.dropped == 0
    k.tick(T0 + 10)
    assert delivery.lost
    assert "no progress" in delivery.lost_why
    assert message.dropped == 1
    assert metrics.get(Counter.STALLED) == 1
    k.tick(T0 + 20)  # given up once
    assert message.dropped == 1


def test_invalid_ack_id_on_renewal_marks_the_delivery_lost() -> None:
    k, metrics = keeper()
    job = FakeJob()
    message = FakeMessage(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, "gone"))
    _, delivery = watched(k, message, job)
    job.last_progress = T0 + 5.5
    k.tick(T0 + 6)
    assert delivery.lost
    assert delivery.lost_why == "Pub/Sub refused this delivery's ack id"
    assert metrics.get(Counter.RENEWAL_FAILURES) == 1


def test_other_renewal_errors_do_not_lose_ownership() -> None:
    k, metrics = keeper()
    job = FakeJob()
    message = FakeMessage(AcknowledgeError(AcknowledgeStatus.OTHER, "transient"))
    _, delivery = watched(k, message, job)
    job.last_progress = T0 + 5.5
    k.tick(T0 + 6)
    assert not delivery.lost
    assert metrics.get(Counter.RENEWAL_FAILURES) == 1


def test_the_cap_counts_from_receipt() -> None:
    """Time spent waiting before the claim counts towards MAX_PROCESSING_SECONDS."""
    k, metrics = keeper(lease_s=10, cap_s=30)
    job, message = FakeJob(), FakeMessage()
    ticket, _ = watched(k, message)
    k.tick(T0 + 25)  # waited 25 s for a thread
    k.attach(ticket, job, "k", now=T0 + 25)
    job.last_progress = T0 + 30.5
    k.tick(T0 + 31)
    assert job.abandoned
    assert message.dropped == 1
    assert metrics.get(Counter.ABANDONED) == 1
    renewals = len(message.renewals)
    k.tick(T0 + 40)
    assert len(message.renewals) == renewals  # no longer renewed


def test_a_job_claimed_after_the_cap_is_abandoned_at_once() -> None:
    k, _ = keeper(lease_s=10, cap_s=30)
    job, message = FakeJob(), FakeMessage()
    delivery = Delivery("m1", "ack-1", 1, "d1")
    ticket = k.watch(message, delivery, received_at=time.monotonic() - 31, published_at=time.time())
    k.attach(ticket, job, "k")
    assert job.abandoned


def test_gauges_follow_the_messages_in_hand() -> None:
    k, _ = keeper()
    job = FakeJob()
    delivery = Delivery("m1", "ack-1", 1, "d1")
    ticket = k.watch(FakeMessage(), delivery, received_at=T0, published_at=time.time() - 42)
    assert (k.watched(), k.in_flight()) == (1, 0)
    k.attach(ticket, job, "k", now=T0)
    assert k.in_flight() == 1
    assert 41 <= k.oldest_age_s() <= 44
    k.forget(ticket)
    assert (k.in_flight(), k.watched(), k.oldest_age_s()) == (0, 0, 0.0)


def test_start_and_stop_are_idempotent() -> None:
    before = set(threading.enumerate())  # keepers of other tests in this process may run
    k, _ = keeper()
    k.start()
    k.start()
    started = [
        t
        for t in threading.enumerate()
        if t not in before and t.name == "pubsub-worker-lease-keeper"
    ]
    assert len(started) == 1
    k.stop()
    k.stop()
    assert not started[0].is_alive()


def test_a_held_message_is_renewed_without_progress_and_never_given_up() -> None:
    """A message the callback handed to its own threads is kept, as the stock client keeps it."""
    k, metrics = keeper(lease_s=10, cap_s=100)
    job, message = FakeJob(), FakeMessage()
    job.held = True
    watched(k, message, job)
    for now in range(1, 60):
        k.tick(T0 + now)
    assert message.renewals == [10] * 11  # every half lease, no progress needed
    assert message.dropped == 0
    assert metrics.get(Counter.STALLED) == 0


def test_an_acked_message_whose_conclusion_is_being_written_is_kept_not_given_up() -> None:
    """Acked from the user's pool after a long hand-off: no step ran for over a lease, but
    the outcome is decided and its completion on its way; giving it up now would drop a
    message whose completion lands a moment later (a redelivery for nothing)."""
    k, metrics = keeper(lease_s=10, cap_s=100)
    job, message = FakeJob(), FakeMessage()
    job.held = True
    watched(k, message, job)
    for now in range(1, 15):
        k.tick(T0 + now)
    held = len(message.renewals)
    job.held, job.settling = False, True  # ack() from the pool: the completion is written
    for now in range(15, 40):
        k.tick(T0 + now)
    assert message.dropped == 0
    assert metrics.get(Counter.STALLED) == 0
    assert len(message.renewals) - held == 5  # every half lease, as while it was held


def test_a_held_message_past_the_cap_is_concluded_not_dropped() -> None:
    k, metrics = keeper(lease_s=10, cap_s=30)
    job, message = FakeJob(), FakeMessage()
    job.held = True
    ticket, _ = watched(k, message, job)
    expired = threading.Event()
    ticket.expire = expired.set
    k.tick(T0 + 31)
    assert expired.wait(5)  # a failed attempt: released and nacked by the flow
    assert message.dropped == 0
    assert job.abandoned
    assert metrics.get(Counter.ABANDONED) == 1
    k.stop()


def test_the_firestore_lease_is_renewed_when_due_while_the_job_lives() -> None:
    """The two leases go together: a due job-document lease is renewed off the keeper's thread."""
    k, _ = keeper(lease_s=10)
    job, message = FakeJob(), FakeMessage()
    watched(k, message, job)
    k.tick(T0 + 2)
    assert not job.kept_alive.acquire(timeout=0.2)  # not due
    job.store_lease_due = True
    k.tick(T0 + 4)
    assert job.kept_alive.acquire(timeout=5)
    k.stop()
