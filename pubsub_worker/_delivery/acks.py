"""Exactly-once acks sent straight to Pub/Sub, several at once, not one after another.

With exactly-once delivery the stock client sends every ack as a unary
``Acknowledge`` RPC from its dispatcher's one thread, one RPC at a time,
waiting up to 10 ms more after a busy round for company. Its own callbacks
ack the moment they start, so the acks of one pull response leave
together. The wrapper's ack only once the job's completion is durable, at
times of their own: at production round trips a quarter to a third of them
reached the dispatcher while it waited for another RPC, and waited a round
trip or more behind it (``docs/benchmarks-history.md``, anchor ``ack-queue``).

:class:`Acks` sends them itself, on the subscriber client's own channel and
to the subscription the message came from: up to ``max_in_flight`` RPCs at
once, the acks that arrive meanwhile joined in the next. Once answered, the
message is ``drop()``-ped from the client's lease management, which frees
its flow-control slot and lets its ordering key go on, as the client does
after an ack. The answer is the stock one: a future that resolves with
``AcknowledgeStatus.SUCCESS`` or raises ``AcknowledgeError`` with the
status the client would give (``INVALID_ACK_ID`` for an expired ack ID).
Whatever is not clearly one or the other (a transient error, a whole RPC
refused) is handed to the stock path, ``message.ack_with_response()``,
with its retries and its answers.

Only while round trips are long. On a fast network (the emulator on
loopback) an RPC per ack costs the process more than the queueing it saves:
the client's dispatcher gathers the acks of 10 ms in one RPC where direct
acks, answered in a millisecond, would each go alone. So each stream keeps
a moving average of its direct ``Acknowledge`` round trips: below
``slow_after_s`` (5 ms) its acks go the stock way, one in ``PROBE_S`` (2 s)
excepted to keep the average current. Except an ack whose answer a thread
waits for (``awaited``: an unchanged stock callback's
``ack_with_response().result()``): the dispatcher's 10 ms would be that
thread's, and the callback threads are what limits such a consumer. Those go
direct on a fast network too, one RPC at a time per stream, the acks that
come meanwhile joined in the next.

The stock path stays for every message this cannot serve alike: one not
from a stock client's streaming pull (a push delivery, a test's), one of a
subscription without exactly-once delivery (the stream carries its acks),
one traced by the client's own OpenTelemetry (its spans end on its ack),
every ack once its stream began to close (``future.cancel()``) and every
ack once :meth:`Acks.stop` was called (``drain()``): the client's
dispatcher sends what it queued before its stream ends. An ack sent
directly just before a close whose RPC is cut by ``subscriber.close()`` is
lost; its message comes back and its next delivery acks it from the job's
record (``drain()`` first, as :func:`pubsub_worker.run` does, waits for it).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import grpc
from google.api_core import gapic_v1
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.pubsub_v1.types import AcknowledgeRequest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status  # type: ignore[import-untyped]

__all__ = ["MAX_ACK_IDS", "PROBE_S", "SLOW_AFTER_S", "Acks", "manager_of"]

_LOGGER = logging.getLogger(__name__)

MAX_ACK_IDS = 1000
"""Ack IDs in one request at most (the stock client sends up to 2,500; 512 KB a request)."""
_TIMEOUT_S = 60.0
"""An ``Acknowledge`` RPC's deadline, the stock client's."""
SLOW_AFTER_S = 0.005
"""Direct acks while a stream's ``Acknowledge`` round trips average this long or longer."""
PROBE_S = 2.0
"""On a fast network, one ack this often still goes direct, to measure the round trip."""
_WEIGHT = 0.2
"""The weight of the latest round trip in the moving average."""

Answer = concurrent.futures.Future[Any]
_Pending = tuple[Any, Answer]
"""A message and the future of its ack's answer."""


class Acks:
    """Sends the acks of stock clients' messages, ``max_in_flight`` RPCs at once per stream.

    Thread-safe. :meth:`send` never blocks on the network; the answers are
    settled on one thread of its own (``pubsub-worker-acks``), never on
    gRPC's, so a slow answer callback holds up no RPC.
    """

    def __init__(
        self,
        *,
        max_in_flight: int = 4,
        slow_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._max_in_flight = max_in_flight
        self._slow_after_s = SLOW_AFTER_S if slow_after_s is None else slow_after_s
        self._clock = clock
        self._lock = threading.Condition()  # guards everything below
        self._streams: weakref.WeakKeyDictionary[Any, _Stream | None] = (
            weakref.WeakKeyDictionary()
        )  # None: a manager whose acks go the stock way
        self._last: tuple[weakref.ReferenceType[Any], _Stream | None] | None = None
        """The manager looked up last, weakly, and its stream: most workers have one."""
        self._in_flight = 0  # RPCs, over every stream
        self._direct = True
        self._answers = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pubsub-worker-acks"
        )

    def send(self, message: Any, *, awaited: bool = False) -> Answer:
        """Ack ``message``; the future of its answer, as ``message.ack_with_response()``'s.

        ``awaited``: a thread waits for the answer; on a fast network it goes straight to
        Pub/Sub too, one RPC at a time per stream (see the module's doc).
        """
        stream = self._stream_of(message)
        if stream is None:
            return message.ack_with_response()  # type: ignore[no-any-return]
        with self._lock:
            due = self._due(stream)
            if not self._direct or not (awaited or due):
                batch = None
            else:
                answer: Answer = concurrent.futures.Future()
                if stream.sending < (self._max_in_flight if due else 1):
                    stream.sending += 1
                    self._in_flight += 1
                    batch = [(message, answer)]
                else:
                    stream.queue.append((message, answer))
                    return answer
        if batch is None:  # the stock way: the client's own future, no second one made
            return message.ack_with_response()  # type: ignore[no-any-return]
        self._send(stream, batch)
        return answer

    def _due(self, stream: _Stream) -> bool:
        """Whether this ack goes direct: round trips long (or unknown), or a probe is due."""
        average = stream.round_trip_s
        if average is None or average >= self._slow_after_s:
            return True
        return self._clock() >= stream.probe_at

    def stop(self, timeout_s: float | None = None) -> bool:
        """Send every later ack the stock way; wait for those under way. False: timed out."""
        with self._lock:
            self._direct = False
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout_s)

    def resume(self) -> None:
        """Send acks directly again (a worker started again)."""
        with self._lock:
            self._direct = True

    def close(self) -> None:
        """Stop (waiting for the acks under way) and end the answers' thread."""
        self.stop(_TIMEOUT_S)
        self._answers.shutdown(wait=True)

    # -- internals -------------------------------------------------------------------

    def _stream_of(self, message: Any) -> _Stream | None:
        """The stream ``message`` came from, when its acks can go straight to Pub/Sub."""
        query = getattr(message, "_exactly_once_delivery_enabled_func", None)
        manager = getattr(query, "__self__", None)  # manager_of(message), its query kept
        if query is None or manager is None or getattr(message, "opentelemetry_data", None):
            return None
        last = self._last  # the one manager of a worker, seen already: no lock, no lookup
        stream = last[1] if last is not None and last[0]() is manager else self._known(manager)
        if stream is None or not query() or not stream.active():
            return None  # without exactly-once delivery the stream carries the acks; closing:
        return stream  # the client's dispatcher sends its queued acks before the stream ends

    def _known(self, manager: Any) -> _Stream | None:
        """The stream of ``manager``, made the first time it is seen, and remembered as last."""
        with self._lock:
            try:
                known = manager in self._streams
            except TypeError:  # not weakly referenceable: not the client's manager
                return None
            stream = self._streams[manager] if known else None
        if not known:
            stream = _Stream.of(manager)
            with self._lock:
                self._streams[manager] = stream
        self._last = (weakref.ref(manager), stream)
        return stream

    def _send(self, stream: _Stream, batch: list[_Pending]) -> None:
        request = AcknowledgeRequest(
            subscription=stream.subscription, ack_ids=[message.ack_id for message, _ in batch]
        )
        sent = self._clock()
        stream.probe_at = sent + PROBE_S  # every direct RPC measures the round trip
        try:
            call = stream.call.future(request, timeout=_TIMEOUT_S, metadata=stream.metadata)
        except Exception as exc:  # noqa: BLE001 - a channel already closed, say: the stock path
            self._answers_submit(stream, batch, exc)
            return

        def answered(done: Any) -> None:
            error = done.exception()
            if error is None:
                stream.measured(self._clock() - sent)
            self._answers_submit(stream, batch, error)

        call.add_done_callback(answered)

    def _answers_submit(
        self, stream: _Stream, batch: list[_Pending], error: BaseException | None
    ) -> None:
        try:
            self._answers.submit(self._answered, stream, batch, error)
        except RuntimeError:  # closed: settle here
            self._answered(stream, batch, error)

    def _answered(
        self, stream: _Stream, batch: list[_Pending], error: BaseException | None
    ) -> None:
        """Settle each ack of an answered RPC; send the acks queued meanwhile."""
        try:
            reasons = _reasons(error) if error is not None else {}
            for message, answer in batch:
                _settle(message, answer, error, reasons.get(message.ack_id, ""))
        finally:
            with self._lock:
                queued = stream.queue
                direct = bool(queued) and self._direct and stream.active()
                if direct:  # the slot goes on to the acks queued meanwhile
                    following = [queued.popleft() for _ in range(min(len(queued), MAX_ACK_IDS))]
                else:
                    following = list(queued)
                    queued.clear()
                    stream.sending -= 1
                    self._in_flight -= 1
                    self._lock.notify_all()
            if direct:
                self._send(stream, following)
            else:
                for message, answer in following:  # stopped meanwhile: the stock way
                    _chain(message.ack_with_response(), answer)


def manager_of(message: Any) -> Any | None:
    """The streaming pull manager a stock client's message came from, or None.

    The client builds each message with its manager's exactly-once query, a
    bound method: its ``__self__`` is the manager (its subscription, its client).
    """
    query = getattr(message, "_exactly_once_delivery_enabled_func", None)
    return getattr(query, "__self__", None)


class _Stream:
    """One stock streaming pull: its subscription, its client's ``Acknowledge``, what is queued."""

    def __init__(self, subscription: str, call: Any, manager: Any) -> None:
        self.subscription = subscription
        self.call = call
        self._manager = weakref.ref(manager)
        self.metadata = (
            gapic_v1.routing_header.to_grpc_metadata((("subscription", subscription),)),  # type: ignore[no-untyped-call]
        )
        self.sending = 0
        self.queue: collections.deque[_Pending] = collections.deque()
        self.round_trip_s: float | None = None
        """Moving average of the answered direct RPCs (None before the first)."""
        self.probe_at = 0.0  # on a fast network, when the next ack goes direct

    def measured(self, round_trip_s: float) -> None:
        """A direct RPC was answered in ``round_trip_s`` (a float's store is atomic)."""
        average = self.round_trip_s
        self.round_trip_s = (
            round_trip_s if average is None else average + _WEIGHT * (round_trip_s - average)
        )

    def active(self) -> bool:
        """The stream still pulls: once it closes, acks go through the client's dispatcher."""
        manager = self._manager()
        return manager is not None and bool(getattr(manager, "is_active", False))

    @classmethod
    def of(cls, manager: Any) -> _Stream | None:
        """The stream of a streaming pull manager; None if it is not the one this knows."""
        subscription = getattr(manager, "_subscription", None)
        transport = getattr(getattr(manager, "_client", None), "_transport", None)
        call = getattr(transport, "acknowledge", None)
        if not isinstance(subscription, str) or not hasattr(call, "future"):
            _LOGGER.debug("acks go the stock client's way: its stream is not the one known")
            return None
        return cls(subscription, call, manager)


def _settle(message: Any, answer: Answer, error: BaseException | None, reason: str) -> None:
    """One ack's answer, as the stock client gives it; unclear ones go the stock way."""
    if error is None:
        message.drop()  # out of lease management: its flow-control slot, its ordering key
        answer.set_result(AcknowledgeStatus.SUCCESS)
    elif reason == "PERMANENT_FAILURE_INVALID_ACK_ID":
        message.drop()
        answer.set_exception(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, info=None))
    elif reason and not reason.startswith("TRANSIENT_"):
        message.drop()
        answer.set_exception(AcknowledgeError(AcknowledgeStatus.OTHER, reason))
    else:  # transient, or the whole RPC refused: the stock path, its retries and its answers
        _chain(message.ack_with_response(), answer)


def _chain(source: Answer, answer: Answer) -> None:
    def copy(done: Answer) -> None:
        error = done.exception()
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(done.result())

    source.add_done_callback(copy)


def _reasons(error: BaseException) -> dict[str, str]:
    """The exactly-once error of each ack ID the RPC's status names (``ErrorInfo``)."""
    if not isinstance(error, grpc.Call):
        return {}
    try:
        status = rpc_status.from_call(error)
    except ValueError:
        return {}
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR) and detail.Unpack(info):
            return dict(info.metadata)
    return {}
