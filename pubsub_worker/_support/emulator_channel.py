"""The worker's channel to the Pub/Sub emulator: a streaming pull ends with a half-close.

The Pub/Sub emulator (0.8.20) ignores a client's cancel of a streaming pull,
and the disconnect of a process that died: it keeps that stream's loop
running until the stream's own deadline, 30 minutes after it was opened
(google-cloud-pubsub's default for ``StreamingPull``). The loop takes
messages from the subscription every 50 ms, as a live stream does, and each
message it takes stays leased for that stream's ack deadline (the stopped
worker's ``LEASE_SECONDS``) before it is offered again, maybe to such a stream
again. So a worker restarted on the emulator waits minutes for messages that
a production subscription would hand it at once (docs/emulator.md). What the
emulator does honour is a half-close: once the client ends its request stream,
the emulator ends the stream and its loop.

The stock client closes its stream by cancelling it (api_core's
``BidiRpc.close``), which leaves such a stale stream behind on every stop.
:func:`half_closing` wraps the emulator channel of
:func:`pubsub_worker._support.clients.subscriber_client` so that cancelling a
streaming pull first ends its request stream and waits (at most
:data:`HALF_CLOSE_WAIT_S`) for the emulator to end the call, then cancels
what is left. Nothing else changes: requests and responses pass through as
they are. A worker killed without a chance to close (``SIGKILL``, a crash)
still leaves its stream; ``python -m emulator end-streams`` ends those.
Production Pub/Sub ends a cancelled stream itself: this wrapper is used only
against the emulator.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

__all__ = ["HALF_CLOSE_WAIT_S", "STREAMING_PULL", "half_closing"]

STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
"""The only method whose calls are wrapped."""

HALF_CLOSE_WAIT_S = 1.0
"""How long a cancel waits for the emulator to end the call after the half-close."""

_END = object()


class _HalfClosingCall:
    """A streaming pull call whose ``cancel()`` half-closes first; the rest passes through."""

    def __init__(self, call: Any, end_requests: Callable[[], None]) -> None:
        self._call = call
        self._end_requests = end_requests

    def cancel(self) -> bool:
        """End the request stream, give the emulator a moment to end the call, then cancel."""
        self._end_requests()
        ended = threading.Event()
        self._call.add_done_callback(lambda _call: ended.set())
        ended.wait(HALF_CLOSE_WAIT_S)
        return bool(self._call.cancel())

    def __iter__(self) -> _HalfClosingCall:
        return self

    def __next__(self) -> Any:
        return next(self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _Requests:
    """The client's request iterator, read by a thread of its own, so that it can be ended.

    grpc reads requests on its own thread, blocked in ``next()`` of the client's
    iterator; a thread pumping them into a queue lets :meth:`end` stop what grpc
    reads at once, which grpc then sends as the end of the request stream.
    """

    def __init__(self, requests: Iterator[Any]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests = requests
        # Not pubsub-worker-*: `pubsub-worker run` takes those, alive at exit, for stuck callbacks
        threading.Thread(target=self._pump, name="emulator-stream-requests", daemon=True).start()

    def _pump(self) -> None:
        try:
            for request in self._requests:
                self._queue.put(request)
        finally:
            self._queue.put(_END)

    def end(self) -> None:
        self._queue.put(_END)

    def __iter__(self) -> Iterator[Any]:
        while (request := self._queue.get()) is not _END:
            yield request


class _HalfClose(grpc.StreamStreamClientInterceptor):
    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        if client_call_details.method != STREAMING_PULL:
            return continuation(client_call_details, request_iterator)
        requests = _Requests(request_iterator)
        return _HalfClosingCall(continuation(client_call_details, iter(requests)), requests.end)


def half_closing(channel: grpc.Channel) -> grpc.Channel:
    """``channel``, with every streaming pull ending by a half-close before its cancel."""
    return grpc.intercept_channel(channel, _HalfClose())
