"""Acks sent straight to Pub/Sub: batching, answers as the stock client gives them, fallbacks.

The stock client's streaming pull manager is faked here down to what
:class:`~pubsub_worker._delivery.acks.Acks` reads of it (its subscription,
its client's ``Acknowledge`` on the channel, its exactly-once query); the
same path against the emulator and a real subscriber is in
``tests/integration/test_direct_acks.py``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.protobuf import any_pb2  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from pubsub_worker._delivery.acks import MAX_ACK_IDS, PROBE_S, Acks

SUB = "projects/p/subscriptions/s"
WAIT_S = 5.0


class _Call:
    """One ``Acknowledge`` RPC under way: answered by the test."""

    def __init__(self, request: Any) -> None:
        self.ack_ids = list(request.ack_ids)
        self.subscription = request.subscription
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], None]] = []

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._callbacks.append(fn)
        if self._done.is_set():
            fn(self)

    def exception(self) -> BaseException | None:
        return self._error

    def answer(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()
        for fn in self._callbacks:
            fn(self)


class _Acknowledge:
    """The client's ``Acknowledge`` method on its channel: records each call."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self._lock = threading.Lock()

    def future(self, request: Any, *, timeout: float, metadata: Any) -> _Call:
        assert ("x-goog-request-params", f"subscription={SUB}") in metadata
        call = _Call(request)
        with self._lock:
            self.calls.append(call)
        return call


class _Transport:
    def __init__(self) -> None:
        self.acknowledge = _Acknowledge()


class _Client:
    def __init__(self) -> None:
        self._transport = _Transport()


class _Manager:
    """The parts of a streaming pull manager that acks read."""

    def __init__(self, *, exactly_once: bool = True) -> None:
        self._subscription = SUB
        self._client = _Client()
        self.exactly_once = exactly_once
        self.is_active = True

    def _exactly_once_delivery_enabled(self) -> bool:
        return self.exactly_once

    @property
    def calls(self) -> list[_Call]:
        return self._client._transport.acknowledge.calls


class _Message:
    """A stock message as acks see it: its ack ID, its manager, its own ``ack``, ``drop``."""

    def __init__(self, manager: _Manager | None, n: int, *, traced: bool = False) -> None:
        self.ack_id = f"ack-{n}"
        if manager is not None:
            self._exactly_once_delivery_enabled_func = manager._exactly_once_delivery_enabled
        self.opentelemetry_data: object | None = object() if traced else None
        self.dropped = 0
        self.stock_acks = 0
        self.stock_answer: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def drop(self) -> None:
        self.dropped += 1

    def ack_with_response(self) -> concurrent.futures.Future[Any]:
        self.stock_acks += 1
        return self.stock_answer


@pytest.fixture
def acks() -> Iterator[Acks]:
    sender = Acks(max_in_flight=2, slow_after_s=0.0)  # every round trip counts as long
    yield sender
    sender.close()


def _status_error(code: grpc.StatusCode, reasons: dict[str, str]) -> grpc.RpcError:
    """An RPC error whose status carries exactly-once ``ErrorInfo``, as Pub/Sub sends it."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="EXACTLY_ONCE_ACKID_FAILURE", metadata=reasons))
    status = status_pb2.Status(code=code.value[0], message="some acks failed", details=[detail])

    class _Error(grpc.RpcError, grpc.Call):
        def code(self) -> grpc.StatusCode:
            return code

        def details(self) -> str:
            return "some acks failed"

        def trailing_metadata(self) -> Any:
            return (("grpc-status-details-bin", status.SerializeToString()),)

        def initial_metadata(self) -> Any:
            return ()

        def is_active(self) -> bool:
            return False

        def time_remaining(self) -> float:
            return 0.0

        def cancel(self) -> bool:
            return False

        def add_callback(self, callback: Any) -> bool:
            return False

    return _Error()


def _unavailable() -> grpc.RpcError:
    class _Error(grpc.RpcError):
        pass

    return _Error()


def test_an_ack_goes_at_once_and_its_answer_drops_the_message_from_lease_management(
    acks: Acks,
) -> None:
    manager = _Manager()
    message = _Message(manager, 1)
    answer = acks.send(message)
    assert [call.ack_ids for call in manager.calls] == [["ack-1"]]
    assert manager.calls[0].subscription == SUB
    assert not answer.done()
    assert message.dropped == 0  # still leased while the RPC flies
    manager.calls[0].answer()
    assert answer.result(WAIT_S) is AcknowledgeStatus.SUCCESS
    assert message.dropped == 1
    assert message.stock_acks == 0


def test_past_max_in_flight_acks_queue_and_leave_together_in_the_next_rpc(acks: Acks) -> None:
    manager = _Manager()
    messages = [_Message(manager, n) for n in range(5)]
    answers = [acks.send(message) for message in messages]
    assert [call.ack_ids for call in manager.calls] == [["ack-0"], ["ack-1"]]  # two in flight
    manager.calls[0].answer()
    answers[0].result(WAIT_S)
    assert answers[2].done() is False
    _wait(lambda: len(manager.calls) == 3)
    assert manager.calls[2].ack_ids == ["ack-2", "ack-3", "ack-4"]  # the queued ones, together
    manager.calls[1].answer()
    manager.calls[2].answer()
    assert all(a.result(WAIT_S) is AcknowledgeStatus.SUCCESS for a in answers)
    assert [m.dropped for m in messages] == [1] * 5


def test_an_rpc_holds_at_most_max_ack_ids() -> None:
    sender = Acks(max_in_flight=1, slow_after_s=0.0)
    try:
        manager = _Manager()
        answers = [sender.send(_Message(manager, n)) for n in range(MAX_ACK_IDS + 2)]
        manager.calls[0].answer()
        _wait(lambda: len(manager.calls) == 2)
        assert len(manager.calls[1].ack_ids) == MAX_ACK_IDS
        manager.calls[1].answer()
        _wait(lambda: len(manager.calls) == 3)
        assert manager.calls[2].ack_ids == [f"ack-{MAX_ACK_IDS + 1}"]
        manager.calls[2].answer()
        assert all(a.result(WAIT_S) is AcknowledgeStatus.SUCCESS for a in answers)
    finally:
        sender.close()


def test_each_ack_of_a_failed_rpc_gets_its_own_exactly_once_answer(acks: Acks) -> None:
    """Expired: ``INVALID_ACK_ID``; another permanent reason: ``OTHER``; transient: stock path."""
    manager = _Manager()
    acks.send(_Message(manager, 0))
    acks.send(_Message(manager, 1))
    expired, refused, transient = (_Message(manager, n) for n in (2, 3, 4))
    answers = [acks.send(m) for m in (expired, refused, transient)]
    manager.calls[0].answer()
    _wait(lambda: len(manager.calls) == 3)
    manager.calls[2].answer(
        _status_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            {
                "ack-2": "PERMANENT_FAILURE_INVALID_ACK_ID",
                "ack-3": "PERMANENT_FAILURE_OTHER",
                "ack-4": "TRANSIENT_FAILURE_UNORDERED_ACK_ID",
            },
        )
    )
    with pytest.raises(AcknowledgeError) as invalid:
        answers[0].result(WAIT_S)
    assert invalid.value.error_code is AcknowledgeStatus.INVALID_ACK_ID
    with pytest.raises(AcknowledgeError) as other:
        answers[1].result(WAIT_S)
    assert other.value.error_code is AcknowledgeStatus.OTHER
    assert (expired.dropped, refused.dropped) == (1, 1)  # out of lease management, as the client
    assert (expired.stock_acks, refused.stock_acks) == (0, 0)
    _wait(lambda: transient.stock_acks == 1)  # the stock path retries it
    assert transient.dropped == 0
    assert not answers[2].done()
    transient.stock_answer.set_result(AcknowledgeStatus.SUCCESS)
    assert answers[2].result(WAIT_S) is AcknowledgeStatus.SUCCESS
    manager.calls[1].answer()


def test_a_whole_rpc_refused_goes_the_stock_way_with_its_answer(acks: Acks) -> None:
    manager = _Manager()
    message = _Message(manager, 1)
    answer = acks.send(message)
    manager.calls[0].answer(_unavailable())
    _wait(lambda: message.stock_acks == 1)
    message.stock_answer.set_exception(AcknowledgeError(AcknowledgeStatus.PERMISSION_DENIED, None))
    with pytest.raises(AcknowledgeError) as denied:
        answer.result(WAIT_S)
    assert denied.value.error_code is AcknowledgeStatus.PERMISSION_DENIED
    assert message.dropped == 0  # the stock path drops it itself


@pytest.mark.parametrize(
    ("why", "message"),
    [
        ("not from a stock streaming pull (push, a test's fake)", _Message(None, 1)),
        ("a subscription without exactly-once delivery", _Message(_Manager(exactly_once=False), 1)),
        ("traced by the client's own OpenTelemetry", _Message(_Manager(), 1, traced=True)),
    ],
)
def test_the_stock_path_acks_what_it_alone_can_ack_alike(
    acks: Acks, why: str, message: _Message
) -> None:
    assert acks.send(message) is message.stock_answer, why
    assert message.stock_acks == 1


def test_stop_waits_for_the_acks_under_way_and_sends_later_ones_the_stock_way(acks: Acks) -> None:
    manager = _Manager()
    flying = _Message(manager, 1)
    answer = acks.send(flying)
    acks.send(_Message(manager, 2))
    queued = _Message(manager, 3)
    queued_answer = acks.send(queued)  # two in flight: queued
    stopped = concurrent.futures.ThreadPoolExecutor(1).submit(acks.stop, WAIT_S)
    later = _Message(manager, 4)
    _wait(lambda: acks.send(later) is later.stock_answer)
    assert not stopped.done()  # two RPCs still under way
    manager.calls[0].answer()
    manager.calls[1].answer()
    assert stopped.result(WAIT_S) is True
    assert answer.result(WAIT_S) is AcknowledgeStatus.SUCCESS
    assert queued.stock_acks == 1  # never sent directly: handed to the stock path
    queued.stock_answer.set_result(AcknowledgeStatus.SUCCESS)
    assert queued_answer.result(WAIT_S) is AcknowledgeStatus.SUCCESS
    assert len(manager.calls) == 2
    acks.resume()
    again = _Message(manager, 5)
    acks.send(again)
    assert manager.calls[-1].ack_ids == ["ack-5"]
    manager.calls[-1].answer()


def test_once_the_stream_closes_acks_go_the_stock_way_queued_ones_too(acks: Acks) -> None:
    """``future.cancel()``: the client's dispatcher sends its acks before the stream ends."""
    manager = _Manager()
    acks.send(_Message(manager, 0))
    acks.send(_Message(manager, 1))
    queued = _Message(manager, 2)
    acks.send(queued)
    manager.is_active = False
    later = _Message(manager, 3)
    assert acks.send(later) is later.stock_answer
    manager.calls[0].answer()
    manager.calls[1].answer()
    _wait(lambda: queued.stock_acks == 1)
    assert len(manager.calls) == 2


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_on_a_fast_network_acks_go_the_stock_way_but_for_a_probe_now_and_then() -> None:
    """Answered under ``slow_after_s``: the client's dispatcher gathers acks more cheaply."""
    clock = _Clock()
    sender = Acks(slow_after_s=0.005, clock=clock)
    try:
        manager = _Manager()
        first = _Message(manager, 0)
        sender.send(first)  # no round trip known yet: direct
        clock.now += 0.001
        manager.calls[0].answer()  # answered in 1 ms
        _wait(lambda: first.dropped == 1)
        stocked = _Message(manager, 1)
        assert sender.send(stocked) is stocked.stock_answer
        clock.now += PROBE_S
        probe = _Message(manager, 2)
        sender.send(probe)  # a probe keeps the average current
        assert [call.ack_ids for call in manager.calls] == [["ack-0"], ["ack-2"]]
        clock.now += 0.040
        manager.calls[1].answer()  # 40 ms now: the average (8.8 ms) passes slow_after_s
        _wait(lambda: probe.dropped == 1)
        slow = _Message(manager, 3)
        assert sender.send(slow) is not slow.stock_answer
        assert manager.calls[-1].ack_ids == ["ack-3"]
        manager.calls[-1].answer()
    finally:
        sender.close()


def test_on_a_fast_network_an_awaited_ack_goes_direct_one_rpc_at_a_time() -> None:
    """A thread waits for its answer: the dispatcher's 10 ms would be that thread's wait."""
    clock = _Clock()
    sender = Acks(slow_after_s=0.005, clock=clock)
    try:
        manager = _Manager()
        first = _Message(manager, 0)
        sender.send(first)
        clock.now += 0.001
        manager.calls[0].answer()  # answered in 1 ms: a fast network
        _wait(lambda: first.dropped == 1)
        plain = _Message(manager, 1)
        assert sender.send(plain) is plain.stock_answer  # nobody waits: the stock way
        awaited = [_Message(manager, n) for n in (2, 3, 4)]
        answers = [sender.send(message, awaited=True) for message in awaited]
        assert not any(a is m.stock_answer for a, m in zip(answers, awaited, strict=True))
        assert [call.ack_ids for call in manager.calls] == [["ack-0"], ["ack-2"]]
        manager.calls[1].answer()
        _wait(lambda: len(manager.calls) == 3)
        assert manager.calls[2].ack_ids == ["ack-3", "ack-4"]  # those that came meanwhile
        manager.calls[2].answer()
        _wait(lambda: all(message.dropped == 1 for message in awaited))
        assert [a.result(WAIT_S) for a in answers] == [AcknowledgeStatus.SUCCESS] * 3
        assert plain.dropped == 0  # the stock path's own ack keeps it
    finally:
        sender.close()


def test_acks_of_two_streams_in_turn_each_go_to_their_own_stream(acks: Acks) -> None:
    """The stream looked up last is remembered; a message of another stream is not sent on it."""
    first, second = _Manager(), _Manager()
    second._subscription = SUB  # the same subscription, another stream and client
    stock = _Manager(exactly_once=False)
    messages = [_Message(m, n) for n, m in enumerate((first, second, first, stock, second))]
    for message in messages:
        acks.send(message)
    assert [c.ack_ids for c in first.calls] == [["ack-0"], ["ack-2"]]
    assert [c.ack_ids for c in second.calls] == [["ack-1"], ["ack-4"]]
    assert stock.calls == []  # no exactly-once: the stock way
    assert messages[3].stock_acks == 1
    for call in (*first.calls, *second.calls):
        call.answer()
    _wait(lambda: all(m.dropped == 1 for n, m in enumerate(messages) if n != 3))


def test_stop_times_out_while_an_rpc_is_unanswered(acks: Acks) -> None:
    manager = _Manager()
    acks.send(_Message(manager, 1))
    assert acks.stop(0.05) is False
    manager.calls[0].answer()
    assert acks.stop(WAIT_S) is True


def test_max_in_flight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Acks(max_in_flight=0)


def _wait(predicate: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(500):
        if predicate():
            return
        done.wait(0.01)
    assert predicate()
