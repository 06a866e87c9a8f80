"""A channel that counts its RPCs, and the items they carry, by method (``RpcCounter``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.cloud.firestore_v1.types import firestore as firestore_types

__all__ = ["CountedChannel", "RpcCounter", "short_method"]

if TYPE_CHECKING:  # generic in the type stubs only
    _UnaryBase = grpc.UnaryUnaryMultiCallable[Any, Any]
    _UnaryStreamBase = grpc.UnaryStreamMultiCallable[Any, Any]
    _StreamUnaryBase = grpc.StreamUnaryMultiCallable[Any, Any]
    _StreamStreamBase = grpc.StreamStreamMultiCallable[Any, Any]
else:
    _UnaryBase = grpc.UnaryUnaryMultiCallable
    _UnaryStreamBase = grpc.UnaryStreamMultiCallable
    _StreamUnaryBase = grpc.StreamUnaryMultiCallable
    _StreamStreamBase = grpc.StreamStreamMultiCallable


def short_method(method: str | bytes) -> str:
    """``/google.firestore.v1.Firestore/Commit`` -> ``Commit``."""
    text = method.decode() if isinstance(method, bytes) else method
    return text.rsplit("/", 1)[-1]


_WRITING = {
    "Commit": firestore_types.CommitRequest.pb(),
    "BatchWrite": firestore_types.BatchWriteRequest.pb(),
}
"""The write methods, and their request classes (a request sent serialized is parsed)."""


def _reads(method: str, request: Any) -> int:
    """Documents a Firestore read RPC is billed for (a query: one, its floor)."""
    if method in {"GetDocument", "RunQuery", "RunAggregationQuery"}:
        return 1
    if method == "BatchGetDocuments":
        return len(getattr(request, "documents", ()) or ())
    return 0


def _deletes(request: Any) -> int:
    """The writes of a ``Commit`` or ``BatchWrite`` that delete a document."""
    count = 0
    for write in getattr(request, "writes", ()) or ():
        raw = getattr(write, "_pb", write)  # proto-plus or raw protobuf
        if raw.WhichOneof("operation") == "delete":
            count += 1
    return count


class RpcCounter:
    """Counts every call started on a channel it counts (:meth:`intercept`); thread-safe.

    ``items`` counts what a request carries: the ``Write`` messages of a
    Firestore ``Commit`` or ``BatchWrite``, the ack ids of a Pub/Sub
    ``Acknowledge`` or ``ModifyAckDeadline``; a write request sent serialized,
    as the batching store sends its ``BatchWrite``, is counted from its bytes
    (parsed first).

    What Firestore bills, by method: ``deletes`` (the writes that delete a
    document; the other writes are billed as writes) and ``reads`` (a
    ``GetDocument`` reads one document, a ``BatchGetDocuments`` each one it
    names, a ``RunQuery`` at least one: Firestore bills a query's results, or
    one read for an empty one, so a query is counted as one, a floor).

    ``micros``: the wall time of the unary calls made blocking (microseconds, by
    method), from the call to its answer: the time a caller waited for them.

    It is not a gRPC interceptor: counting from inside ``grpc.intercept_channel``
    put 16-26 us of the caller's CPU on every unary call on the benchmark's
    machine (``python -m benchmarks.rpc_cost``: ``raw-intercepted`` against
    ``raw-counted``), and only the wrapper's consumer makes Firestore RPCs, so
    the count cost the wrapper alone. :class:`CountedChannel` counts with one
    call around the channel's own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards calls and items
        self.calls: Counter[str] = Counter()
        self.items: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.deletes: Counter[str] = Counter()
        self.micros: Counter[str] = Counter()

    def intercept(self, channel: grpc.Channel) -> grpc.Channel:
        """``channel`` with its calls counted here."""
        return CountedChannel(channel, self)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Calls and items so far, by short method name."""
        with self._lock:
            return {
                "calls": dict(self.calls),
                "items": dict(self.items),
                "reads": dict(self.reads),
                "deletes": dict(self.deletes),
                "micros": dict(self.micros),
            }

    def count(self, method: str, request: Any) -> None:
        """One call of ``method`` (short name) with ``request`` (None: a stream of them)."""
        if method in _WRITING and isinstance(request, bytes):
            # Sent serialized (the batching store's BatchWrite): protobuf's C parser reads it
            # in about a microsecond for four writes on the benchmark's machine.
            request = _WRITING[method].FromString(request)
        items = getattr(request, "writes", None) or getattr(request, "ack_ids", None)
        reads = _reads(method, request)
        deletes = _deletes(request) if method in _WRITING else 0
        with self._lock:
            self.calls[method] += 1
            if items is not None:
                self.items[method] += len(items)
            if reads:
                self.reads[method] += reads
            if deletes:
                self.deletes[method] += deletes

    def waited(self, method: str, started: float) -> None:
        """A blocking call of ``method`` answered, ``started`` at this ``perf_counter``."""
        waited = int((time.perf_counter() - started) * 1e6)
        with self._lock:
            self.micros[method] += waited


class _Counted:
    """One method of a counted channel: the channel's own multi-callable, its short name."""

    def __init__(self, inner: Any, method: str, counter: RpcCounter) -> None:
        self._inner, self._method, self._counter = inner, method, counter

    def _timed(self, call: Callable[..., Any], request: Any, *args: Any, **kwargs: Any) -> Any:
        """A unary call counted, and timed until its answer."""
        self._counter.count(self._method, request)
        started = time.perf_counter()
        try:
            return call(request, *args, **kwargs)
        finally:
            self._counter.waited(self._method, started)


class _Unary(_Counted, _UnaryBase):
    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner, request, *args, **kwargs)

    def with_call(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner.with_call, request, *args, **kwargs)

    def future(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, request)  # not waited for here: no time counted
        return self._inner.future(request, *args, **kwargs)


class _UnaryStream(_Counted, _UnaryStreamBase):
    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, request)
        return self._inner(request, *args, **kwargs)


class _StreamUnary(_Counted, _StreamUnaryBase):
    def __call__(self, request_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, None)
        return self._inner(request_iterator, *args, **kwargs)

    def with_call(self, request_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, None)
        return self._inner.with_call(request_iterator, *args, **kwargs)

    def future(self, request_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, None)
        return self._inner.future(request_iterator, *args, **kwargs)


class _StreamStream(_Counted, _StreamStreamBase):
    def __call__(self, request_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        self._counter.count(self._method, None)
        return self._inner(request_iterator, *args, **kwargs)


class CountedChannel(grpc.Channel):
    """A channel whose methods count their calls in an :class:`RpcCounter`; everything else
    is the wrapped channel's own (each method made with the arguments given, passed on)."""

    def __init__(self, channel: grpc.Channel, counter: RpcCounter) -> None:
        self._channel = channel
        self._counter = counter

    def subscribe(self, callback: Callable[..., Any], try_to_connect: bool = False) -> None:
        self._channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Callable[..., Any]) -> None:
        self._channel.unsubscribe(callback)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        inner = self._channel.unary_unary(method, *args, **kwargs)
        return _Unary(inner, short_method(method), self._counter)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        inner = self._channel.unary_stream(method, *args, **kwargs)
        return _UnaryStream(inner, short_method(method), self._counter)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        inner = self._channel.stream_unary(method, *args, **kwargs)
        return _StreamUnary(inner, short_method(method), self._counter)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        inner = self._channel.stream_stream(method, *args, **kwargs)
        return _StreamStream(inner, short_method(method), self._counter)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CountedChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self._channel.close()
