"""A gRPC client interceptor that counts RPCs, and the items they carry, by method."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

__all__ = ["RpcCounter", "short_method"]


def short_method(method: str | bytes) -> str:
    """``/google.firestore.v1.Firestore/Commit`` -> ``Commit``."""
    text = method.decode() if isinstance(method, bytes) else method
    return text.rsplit("/", 1)[-1]


_WRITING = frozenset({"Commit", "BatchWrite"})


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


class RpcCounter(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Counts every call started on an intercepted channel; thread-safe.

    ``items`` counts what a request carries: the ``Write`` messages of a
    Firestore ``Commit`` or ``BatchWrite``, the ack ids of a Pub/Sub
    ``Acknowledge`` or ``ModifyAckDeadline``. A batched write still counts
    as one item.

    What Firestore bills, by method: ``deletes`` (the writes that delete a
    document; the other writes are billed as writes) and ``reads`` (a
    ``GetDocument`` reads one document, a ``BatchGetDocuments`` each one it
    names, a ``RunQuery`` at least one: Firestore bills a query's results, or
    one read for an empty one, so a query is counted as one, a floor).

    ``micros``: the wall time of the unary calls made blocking (microseconds, by
    method), from the call to its answer: the time a caller waited for them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards calls and items
        self.calls: Counter[str] = Counter()
        self.items: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.deletes: Counter[str] = Counter()
        self.micros: Counter[str] = Counter()

    def intercept(self, channel: grpc.Channel) -> grpc.Channel:
        """``channel`` with this counter in front of it."""
        return grpc.intercept_channel(channel, self)

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

    def _count(self, details: Any, request: Any) -> None:
        method = short_method(details.method)
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

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        self._count(client_call_details, request)
        started = time.perf_counter()
        outcome = continuation(client_call_details, request)
        # A blocking call has its answer now; a future's call returns at once (counted ~0).
        waited = int((time.perf_counter() - started) * 1e6)
        with self._lock:
            self.micros[short_method(client_call_details.method)] += waited
        return outcome

    def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        self._count(client_call_details, request)
        return continuation(client_call_details, request)

    def intercept_stream_unary(
        self,
        continuation: Callable[[Any, Iterator[Any]], Any],
        client_call_details: Any,
        request_iterator: Iterator[Any],
    ) -> Any:
        self._count(client_call_details, None)
        return continuation(client_call_details, request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[[Any, Iterator[Any]], Any],
        client_call_details: Any,
        request_iterator: Iterator[Any],
    ) -> Any:
        self._count(client_call_details, None)
        return continuation(client_call_details, request_iterator)
