"""The batch slots: when the next ``BatchWrite`` may go, and how long a batch is held open."""

from __future__ import annotations

import pytest

from pubsub_worker.stores._slots import Slots


def _slots(*, writers: int | None = 3, gather_s: float = 0.002) -> Slots:
    slots = Slots(max_in_flight=1, slow_in_flight=3, slow_after_s=0.005, gather_s=gather_s)
    if writers is not None:
        slots.writers = lambda: writers
    return slots


def _claim_held(slots: Slots, *, queued_at: float, now: float, writing: int) -> float | None:
    """How long a batch with a claim is held."""
    return slots.hold_for(queued_at, now, writing=writing, claims=True)


def _slow(slots: Slots) -> Slots:
    """The slots after one batch answered in 10 ms (over ``slow_after_s``)."""
    slots.take(0.0)
    slots.give_back(0.010)
    return slots


def test_a_slot_is_free_until_max_in_flight_then_a_slow_one_opens_after_slow_after_s() -> None:
    slots = _slots()
    assert slots.free(0.0)
    assert slots.slow_opens_in(0.0) is None  # nothing in flight: no slow slot to wait for
    slots.take(10.0)
    assert not slots.free(10.001)
    assert slots.slow_opens_in(10.001) == pytest.approx(0.004)
    assert slots.free(10.005)  # the youngest batch has been out slow_after_s
    slots.take(10.005)
    slots.take(10.010)
    assert slots.sending == 3
    assert slots.slow_opens_in(20.0) is None  # slow_in_flight reached: none more, however slow
    assert not slots.free(20.0)
    slots.give_back(0.002)
    assert slots.sending == 2
    assert slots.slow_opens_in(20.0) == 0.0


def test_while_round_trips_are_long_a_slow_slot_opens_after_long_wait_s() -> None:
    """At 10 ms round trips a write waits 1 ms for a slot, not 5; back on loopback, 5 again."""
    slots = _slow(_slots())  # the round trips average 10 ms: long
    slots.take(10.0)
    assert slots.slow_opens_in(10.0004) == pytest.approx(0.0006)
    assert not slots.free(10.0009)
    assert slots.free(10.001)
    slots.take(10.001)
    assert slots.slow_opens_in(10.0015) == pytest.approx(0.0005)  # from the youngest batch
    for _ in range(20):  # answered in 1 ms: the average falls under slow_after_s
        slots.take(10.001)
        slots.give_back(0.001)
    assert slots.round_trip_s < 0.005
    assert slots.slow_opens_in(10.002) == pytest.approx(0.004)


def test_at_long_round_trips_a_slot_waits_for_a_job_that_may_add_a_write() -> None:
    """Three jobs in flight: while one has no write out, a slow slot opens after
    ``slow_after_s`` (a backlog keeps batching); once each has one, after ``long_wait_s``."""
    slots = _slow(_slots(writers=3))
    slots.take(10.0)
    assert slots.slow_opens_in(10.0, 2) == pytest.approx(0.005)
    assert not slots.free(10.002, 2)
    assert slots.slow_opens_in(10.0, 3) == pytest.approx(0.001)
    assert slots.free(10.001, 3)
    slots.writers = None  # no worker said: nobody is waited for
    assert slots.slow_opens_in(10.0, 2) == pytest.approx(0.001)


def test_one_slow_answer_among_short_ones_opens_no_slot_early() -> None:
    """On loopback an emulator's pause lifts the average over ``slow_after_s``; the
    answers after it are short again, and a write waits ``slow_after_s`` for a slot."""
    slots = _slots()
    for round_trip_s in (0.001, 0.030):
        slots.take(0.0)
        slots.give_back(round_trip_s)
    slots.take(10.0)
    assert slots.slow_opens_in(10.0) == pytest.approx(0.001)  # the latest was long as well
    slots.give_back(0.001)
    assert slots.round_trip_s >= 0.005  # the average still long, the latest short
    slots.take(10.0)
    assert slots.slow_opens_in(10.0) == pytest.approx(0.005)


def test_the_round_trip_is_a_moving_average_of_the_answered_batches() -> None:
    slots = _slots()
    assert slots.round_trip_s == 0.0
    for round_trip_s in (0.010, 0.020, None):  # None: the batch failed before its answer
        slots.take(0.0)
        slots.give_back(round_trip_s)
    assert slots.round_trip_s == pytest.approx(0.010 + 0.2 * (0.020 - 0.010))
    assert slots.sending == 0


def test_a_batch_is_held_open_while_a_job_in_flight_has_no_write_out_yet() -> None:
    """Three jobs in flight, one write queued: the other two may still bring theirs."""
    slots = _slow(_slots(writers=3))
    assert _claim_held(slots, queued_at=1.0, now=1.0005, writing=1) == pytest.approx(0.0015)
    assert _claim_held(slots, queued_at=1.0, now=1.0005, writing=2) == pytest.approx(0.0015)
    assert _claim_held(slots, queued_at=1.0, now=1.002, writing=1) is None  # gather_s at most


def test_with_every_job_s_write_out_a_batch_waits_a_glance_at_most() -> None:
    """Nobody else could add a write: a quarter of ``gather_s``, for a callback not yet started."""
    slots = _slow(_slots(writers=2))
    assert _claim_held(slots, queued_at=1.0, now=1.0001, writing=2) == pytest.approx(0.0004)
    assert _claim_held(slots, queued_at=1.0, now=1.0005, writing=2) is None
    alone = _slow(_slots(writers=1))
    assert _claim_held(alone, queued_at=1.0, now=1.0, writing=1) == pytest.approx(0.0005)
    assert _claim_held(alone, queued_at=1.0, now=1.0006, writing=1) is None


@pytest.mark.parametrize(("waiting", "glance"), [(None, True), (2, True), (0, False)])
def test_the_glance_is_waited_unless_the_worker_knows_no_callback_is_about_to_start(
    waiting: int | None, glance: bool
) -> None:
    """``arriving``: messages received and waiting for a thread (``run()`` tells; None:
    the worker cannot tell). None waiting: a lone claim goes at once."""
    alone = _slow(_slots(writers=1))
    alone.arriving = lambda: waiting
    held = _claim_held(alone, queued_at=1.0, now=1.0, writing=1)
    assert held == (pytest.approx(0.0005) if glance else None)


def test_a_job_without_a_write_out_holds_a_batch_whatever_is_arriving() -> None:
    """The glance is for callbacks not yet started; a job in flight may still bring a write."""
    slots = _slow(_slots(writers=3))
    slots.arriving = lambda: 0
    assert _claim_held(slots, queued_at=1.0, now=1.0005, writing=1) == pytest.approx(0.0015)


def test_a_batch_of_later_writes_only_waits_no_glance() -> None:
    """Completions: a callback about to start would bring a claim, which gains nothing."""
    alone = _slow(_slots(writers=1))
    assert alone.hold_for(queued_at=1.0, now=1.0, writing=1, claims=False) is None
    slots = _slow(_slots(writers=3))  # a job without a write out may still bring one
    assert slots.hold_for(queued_at=1.0, now=1.0005, writing=1, claims=False) == pytest.approx(
        0.0015
    )


def test_with_a_batch_in_flight_nothing_is_held_the_writes_gather_behind_it() -> None:
    slots = _slow(_slots(writers=3))
    slots.take(1.0)
    assert _claim_held(slots, queued_at=1.0, now=1.0, writing=1) is None
    slots.give_back(0.010)
    assert _claim_held(slots, queued_at=1.0, now=1.0, writing=1) == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("why", "writers", "gather_s", "round_trip_s"),
    [
        ("round trips short (loopback)", 3, 0.002, 0.001),
        ("no worker said how many jobs it has", None, 0.002, 0.010),
        ("gathering switched off", 3, 0.0, 0.010),
    ],
)
def test_a_batch_goes_at_once(
    why: str, writers: int | None, gather_s: float, round_trip_s: float
) -> None:
    slots = _slots(writers=writers, gather_s=gather_s)
    slots.take(0.0)
    slots.give_back(round_trip_s)
    assert _claim_held(slots, queued_at=1.0, now=1.0, writing=1) is None, why


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"slow_after_s": 0.0}, "slow_after_s"),
        ({"gather_s": -0.001}, "gather_s"),
        ({"long_wait_s": 0.0}, "long_wait_s"),
    ],
)
def test_bad_options_are_refused(options: dict[str, float], message: str) -> None:
    given: dict[str, float] = {
        "max_in_flight": 1,
        "slow_in_flight": 3,
        "slow_after_s": 0.005,
        "gather_s": 0.002,
        "long_wait_s": 0.001,
        **options,
    }
    with pytest.raises(ValueError, match=message):
        Slots(
            max_in_flight=int(given["max_in_flight"]),
            slow_in_flight=int(given["slow_in_flight"]),
            slow_after_s=given["slow_after_s"],
            gather_s=given["gather_s"],
            long_wait_s=given["long_wait_s"],
        )
