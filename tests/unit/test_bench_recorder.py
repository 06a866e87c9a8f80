"""The benchmark consumer's record of each delivery: when a message counts as done (no
emulator)."""

from __future__ import annotations

from benchmarks.consumer import _Recorder


def test_a_stock_callback_is_done_when_it_returns_after_its_answer() -> None:
    recorder = _Recorder()
    recorder.started("m", 1.0)
    recorder.ended("m")
    recorder.acked("m")
    [(message_id, start, end, done, publish_wall, _)] = recorder.take()
    assert (message_id, publish_wall) == ("m", 1.0)
    assert start <= end <= done


def test_a_callback_answered_before_it_returns_is_done_as_it_returns() -> None:
    # The one added line: the settled hook reports the answer on another thread while the
    # callback still waits in result(); its thread's time runs until it returns.
    recorder = _Recorder()
    recorder.started("m", None)
    recorder.acked("m")
    assert recorder.take() == []  # not done while its callback runs
    recorder.ended("m")
    [(_, start, end, done, _, _)] = recorder.take()
    assert start <= end == done


def test_a_job_style_callback_is_done_at_its_answer_after_it_returned() -> None:
    recorder = _Recorder()
    recorder.started("m", None)
    recorder.ended("m")
    assert recorder.take() == []  # returned, its ack not yet answered
    recorder.acked("m")
    [(_, start, end, done, _, _)] = recorder.take()
    assert start <= end <= done


def test_without_reported_ends_the_answer_finishes_the_message() -> None:
    # run(): the callback's end is the wrapper's before_ack hook, which may not come.
    recorder = _Recorder(callbacks_end=False)
    recorder.started("m", None)
    recorder.acked("m")
    [(_, start, end, done, _, _)] = recorder.take()
    assert start <= end == done


def test_a_message_settled_without_an_ack_is_not_done() -> None:
    recorder = _Recorder()
    recorder.started("m", None)
    recorder.settled("m", "nack", None)
    recorder.ended("m")
    recorder.acked("m")  # a late answer of a message already forgotten
    assert recorder.take() == []
