"""A gRPC proxy in front of an emulator that fails or delays chosen RPCs on demand.

The chaos fleet reaches each emulator through it (behind each worker's
:class:`~emulator.TcpProxy`, which does the cuts and partitions). It relays
every call as raw bytes, metadata and trailers included, so the clients
see the emulator's own answers, and adds faults at the RPC level that a
TCP proxy cannot make:

* **Transient errors** on chosen methods (Pub/Sub ``Acknowledge`` and
  ``ModifyAckDeadline``), for a fraction of the calls while a window is
  open. Half fail *before* the call is relayed (nothing happened), half
  *after* the emulator answered (it happened; the reply is lost), which is
  the case a client cannot tell from the first. The status carries a
  ``grpc-status-details-bin`` trailer, as Google's servers send, so the
  Pub/Sub client's exactly-once code sees the code and retries.
* **Latency** added before every call is relayed (a slow Firestore).

An :class:`Observer` sees each relayed request and answer: the Pub/Sub
ledger (:mod:`benchmarks.chaos.ledger`) counts deliveries and acks there.

The server runs on a thread pool; a relayed stream occupies one thread for
its life. When the client of a stream goes away (killed, cut off), the
upstream stream is half-closed, not cancelled: see :func:`_half_closing`
for the emulator behaviour this stands in for.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Protocol

import grpc
from google.rpc import status_pb2  # type: ignore[import-untyped]

__all__ = [
    "FIRESTORE_SHAPES",
    "PUBSUB_SHAPES",
    "GrpcFaultProxy",
    "Observer",
    "Shape",
]

_CHANNEL_OPTIONS = [
    # Exactly-once ack error trailers list every refused ack id (see clients.CHANNEL_OPTIONS).
    ("grpc.max_metadata_size", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
_SKIPPED_METADATA = ("user-agent", ":authority", "grpc-")
_INJECTED = "injected by the chaos run"
_HALF_CLOSE_GRACE_S = 5.0


class Shape(str, Enum):
    """How a method streams; a generic relay must know it before the first byte."""

    UNARY = "unary"
    SERVER_STREAM = "server_stream"
    BIDI = "bidi"


PUBSUB_SHAPES: Mapping[str, Shape] = {"/google.pubsub.v1.Subscriber/StreamingPull": Shape.BIDI}
"""The streaming methods of Pub/Sub; every other method is unary."""

_FIRESTORE = "/google.firestore.v1.Firestore/"
FIRESTORE_SHAPES: Mapping[str, Shape] = {
    _FIRESTORE + "BatchGetDocuments": Shape.SERVER_STREAM,
    _FIRESTORE + "RunQuery": Shape.SERVER_STREAM,
    _FIRESTORE + "RunAggregationQuery": Shape.SERVER_STREAM,
    _FIRESTORE + "ExecutePipeline": Shape.SERVER_STREAM,
    _FIRESTORE + "Listen": Shape.BIDI,
    _FIRESTORE + "Write": Shape.BIDI,
}
"""The streaming methods of Firestore; every other method is unary."""


class Observer(Protocol):
    """Sees what goes through the proxy (called from the server's threads)."""

    def answered(self, method: str, request: bytes, error: grpc.Call | None) -> None:
        """The emulator's answer to a unary request: ``None`` for OK, else the failed call."""

    def streamed(self, method: str, response: bytes) -> None:
        """One response of a stream, on its way to the client."""

    def opened(self, method: str) -> None:
        """A client opened a stream (a subscriber past its start-up checks, for Pub/Sub)."""


class _Faults:
    """The fault windows now open; set from the orchestrator, read by the server threads."""

    def __init__(self, seed: int) -> None:
        self._lock = threading.Lock()  # guards everything below
        self._rng = random.Random(seed)
        self.error_ratio: dict[str, float] = {}
        self.error_codes: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,)
        self.latency_s: tuple[float, float] = (0.0, 0.0)
        self.injected: dict[str, int] = {}

    def draw_error(self, method: str) -> tuple[str, grpc.StatusCode] | None:
        """``("before" | "after", code)`` for a call that should fail, else None."""
        with self._lock:
            ratio = self.error_ratio.get(method, 0.0)
            if not ratio or self._rng.random() >= ratio:
                return None
            self.injected[method] = self.injected.get(method, 0) + 1
            when = "before" if self._rng.random() < 0.5 else "after"
            return when, self._rng.choice(self.error_codes)

    def draw_latency(self) -> float:
        with self._lock:
            low, high = self.latency_s
            return self._rng.uniform(low, high) if high > 0 else 0.0


class GrpcFaultProxy:
    """Relay every RPC from a free loopback port to ``target``, with faults on demand.

    ``shapes`` names the streaming methods (the rest are unary). Use as a
    context manager or call :meth:`close`.
    """

    def __init__(
        self,
        target: str,
        *,
        shapes: Mapping[str, Shape],
        observer: Observer | None = None,
        seed: int = 0,
        threads: int = 64,
        name: str = "grpc-proxy",
    ) -> None:
        self.target = target
        self._shapes = dict(shapes)
        self._observer = observer
        self._faults = _Faults(seed)
        self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._calls: dict[str, Any] = {}
        self._calls_lock = threading.Lock()  # guards _calls
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name),
            handlers=[_Relay(self)],
            options=_CHANNEL_OPTIONS,
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        """``host:port`` for the clients (or for a :class:`~emulator.TcpProxy` in front)."""
        return f"127.0.0.1:{self.port}"

    @property
    def injected(self) -> dict[str, int]:
        """Errors injected so far, by method."""
        with self._faults._lock:
            return dict(self._faults.injected)

    def fail(
        self,
        methods: Mapping[str, float],
        codes: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,),
    ) -> None:
        """Fail each of ``methods`` (full name) with its probability, until :meth:`heal`."""
        with self._faults._lock:
            self._faults.error_ratio.update(methods)
            self._faults.error_codes = codes

    def heal(self, methods: tuple[str, ...] | None = None) -> None:
        """Stop failing ``methods`` (default: all)."""
        with self._faults._lock:
            for method in methods if methods is not None else tuple(self._faults.error_ratio):
                self._faults.error_ratio.pop(method, None)

    def delay(self, low_s: float, high_s: float) -> None:
        """Add a latency drawn from ``[low_s, high_s]`` before each call; ``0, 0`` turns it off."""
        with self._faults._lock:
            self._faults.latency_s = (low_s, high_s)

    def close(self) -> None:
        """Stop serving (live calls are cancelled) and close the upstream channel. Idempotent."""
        self._server.stop(grace=None).wait(5)
        self._channel.close()

    def __enter__(self) -> GrpcFaultProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the relay (server threads) -----------------------------------------------

    def _upstream(self, method: str, shape: Shape) -> Any:
        """The upstream multi-callable of ``method``, relaying raw bytes."""
        with self._calls_lock:
            call = self._calls.get(method)
            if call is None:
                factory = {
                    Shape.UNARY: self._channel.unary_unary,
                    Shape.SERVER_STREAM: self._channel.unary_stream,
                    Shape.BIDI: self._channel.stream_stream,
                }[shape]
                call = self._calls[method] = factory(method)
            return call

    def _wait(self) -> None:
        latency = self._faults.draw_latency()
        if latency:
            time.sleep(latency)

    def unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._wait()
        fault = self._faults.draw_error(method)
        if fault is not None and fault[0] == "before":
            _abort(context, fault[1])
        try:
            response, call = self._upstream(method, Shape.UNARY).with_call(
                request, metadata=_metadata(context), timeout=context.time_remaining()
            )
        except grpc.RpcError as exc:
            failed: grpc.Call = exc  # type: ignore[assignment]  # a failed call is both
            if self._observer is not None:
                self._observer.answered(method, request, failed)
            _relay_error(context, failed)
        if self._observer is not None:
            self._observer.answered(method, request, None)
        if fault is not None:
            _abort(context, fault[1])
        context.set_trailing_metadata(call.trailing_metadata() or ())
        return response  # type: ignore[no-any-return]

    def server_stream(
        self, method: str, request: bytes, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        self._wait()
        call = self._upstream(method, Shape.SERVER_STREAM)(
            request, metadata=_metadata(context), timeout=context.time_remaining()
        )
        context.add_callback(call.cancel)  # the client went away: nothing more to read
        yield from self._relay_stream(method, call, context)

    def bidi(
        self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        self._wait()
        if self._observer is not None:
            self._observer.opened(method)
        gone = threading.Event()
        context.add_callback(gone.set)
        call = self._upstream(method, Shape.BIDI)(
            _half_closing(requests, gone),
            metadata=_metadata(context),
            timeout=context.time_remaining(),
        )
        try:
            yield from self._relay_stream(method, call, context)
        finally:
            # The upstream half-close ends the call; a cancel is the fallback if it does not.
            timer = threading.Timer(_HALF_CLOSE_GRACE_S, call.cancel)
            timer.daemon = True
            timer.start()

    def _relay_stream(
        self, method: str, call: Any, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        try:
            for response in call:
                if self._observer is not None:
                    self._observer.streamed(method, response)
                yield response
        except grpc.RpcError as exc:
            if context.is_active():
                _relay_error(context, exc)  # type: ignore[arg-type]
            return
        context.set_trailing_metadata(call.trailing_metadata() or ())


_END = object()


def _half_closing(requests: Iterator[bytes], gone: threading.Event) -> Iterator[bytes]:
    """The client's requests, ending (an upstream half-close) when the client goes away.

    The Pub/Sub emulator forgets a streaming pull that the client half-closes,
    but keeps one that is cancelled or whose connection drops, and goes on
    handing messages to it (each then waits out its ack deadline). A client
    that dies or is cut off is thus passed on as a half-close: what a
    production server does when it notices a dead client.
    """
    pending: queue.SimpleQueue[object] = queue.SimpleQueue()

    def pump() -> None:
        try:
            for request in requests:
                pending.put(request)
        except Exception:  # noqa: BLE001, S110 - a client that went away ends its requests
            pass
        finally:
            pending.put(_END)

    threading.Thread(target=pump, name="grpc-proxy-requests", daemon=True).start()
    while True:
        try:
            item = pending.get(timeout=0.2)
        except queue.Empty:
            if gone.is_set():
                return
            continue
        if item is _END:
            return
        yield item  # type: ignore[misc]


class _Relay(grpc.GenericRpcHandler):
    """Maps every method to a relaying handler of the right shape."""

    def __init__(self, proxy: GrpcFaultProxy) -> None:
        self._proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method: str = handler_call_details.method
        shape = self._proxy._shapes.get(method, Shape.UNARY)
        proxy = self._proxy
        if shape is Shape.BIDI:
            return grpc.stream_stream_rpc_method_handler(
                _bound(lambda requests, ctx: proxy.bidi(method, requests, ctx))
            )
        if shape is Shape.SERVER_STREAM:
            return grpc.unary_stream_rpc_method_handler(
                _bound(lambda request, ctx: proxy.server_stream(method, request, ctx))
            )
        return grpc.unary_unary_rpc_method_handler(
            _bound(lambda request, ctx: proxy.unary(method, request, ctx))
        )


def _bound(fn: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, Any], Any]:
    return fn


def _metadata(context: grpc.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    """The client's metadata, without what the channel sets itself."""
    return tuple(
        (key, value)
        for key, value in context.invocation_metadata()
        if not key.startswith(_SKIPPED_METADATA)
    )


def _relay_error(context: grpc.ServicerContext, call: grpc.Call) -> None:
    """End the call with the emulator's status and trailers (``abort`` raises)."""
    context.set_trailing_metadata(call.trailing_metadata() or ())
    context.abort(call.code(), call.details() or "")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode) -> None:
    """End the call with an injected ``code``, a status trailer included (``abort`` raises)."""
    status = status_pb2.Status(code=code.value[0], message=_INJECTED)
    context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
    context.abort(code, _INJECTED)
