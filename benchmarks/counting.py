"""A gRPC client interceptor that counts RPCs, and the items they carry, by method."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

__all__ = ["RpcCounter", "short_method"]


def short_method(method: str | bytes) -> str:
    """``/google.firestore.v1.Firestore/Commit`` -> ``Commit``."""
    text = method.decode() if isinstance(method, bytes) else method
    return text.rsplit("/", 1)[-1]


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
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards calls and items
        self.calls: Counter[str] = Counter()
        self.items: Counter[str] = Counter()

    def intercept(self, channel: grpc.Channel) -> grpc.Channel:
        """``channel`` with this counter in front of it."""
        return grpc.intercept_channel(channel, self)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Calls and items so far, by short method name."""
        with self._lock:
            return {"calls": dict(self.calls), "items": dict(self.items)}

    def _count(self, details: Any, request: Any) -> None:
        method = short_method(details.method)
        items = getattr(request, "writes", None) or getattr(request, "ack_ids", None)
        with self._lock:
            self.calls[method] += 1
            if items is not None:
                self.items[method] += len(items)

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        self._count(client_call_details, request)
        return continuation(client_call_details, request)

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
