"""The client CPU of one Firestore ``BatchWrite`` RPC: ``python -m benchmarks.rpc_cost``.

Starts the Firestore and Pub/Sub emulators, then sends ``--calls`` batches
of ``--writes`` job writes one after another from one thread, each way
twice, alternating:

- ``generated``: the generated client's wrapped ``batch_write`` method
  (proto-plus request, ``api_core``'s retry and timeout layers), as the
  batching store sent them before;
- ``raw``: the request on the client's gRPC channel as the batching store
  sends it now (:func:`pubsub_worker.stores._batch_rpc.batch_write_call`):
  each write serialized once, the request framed from those bytes
  (:func:`pubsub_worker.stores._batch_rpc.request`; the serializing is timed);
- ``raw-future``: the same through the stub's ``future()`` and a done-callback
  (the RPC answered on gRPC's thread), a design the store does not use;
- ``write-stream``: Firestore's bidirectional ``Write`` stream, opened once,
  one request per batch (applied atomically, unlike ``BatchWrite``) and its
  response awaited, a design the store does not use: what a transport that
  pays no call set-up per batch would save;
- ``rest``: the same writes as JSON over HTTP/1.1 to the REST endpoint
  (``documents:batchWrite``) on one kept-alive connection, the emulator's
  only (no credentials): what leaving gRPC would save;
- ``empty-commit``: a ``Commit`` of no writes on the raw channel: the floor,
  what any unary call costs the client here, whatever it carries;
- ``raw-intercepted``: ``raw`` counted from inside a gRPC interceptor
  (``grpc.intercept_channel``), as the benchmark counted a consumer's RPCs
  before, and ``raw-counted``: ``raw`` through the benchmark's RPC counter now
  (:class:`benchmarks.counting.CountedChannel`, one call around the channel's):
  the same counting, with and without the interceptor's layers.

It prints the process CPU time (all threads, ``time.process_time``), the
sending thread's share of it (``time.thread_time``: the rest is gRPC's own
threads, its event engine reading the answers) and the wall time per RPC.
The writes are built before the timing starts.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

from benchmarks.counting import RpcCounter, short_method
from benchmarks.machine import emulators

__all__ = ["main"]


def _senders(client: Any) -> dict[str, Callable[[list[Any]], Any]]:
    from google.cloud.firestore_v1.types import firestore as firestore_types  # noqa: PLC0415

    from pubsub_worker.stores._batch_rpc import batch_write_call, request  # noqa: PLC0415

    api, database = client._firestore_api, client._database_string
    wrapped = firestore_types.BatchWriteRequest
    raw_request = wrapped.pb()
    call, metadata = batch_write_call(client)

    def generated(writes: list[Any]) -> Any:
        request = wrapped.wrap(raw_request(database=database, writes=writes))
        return api.batch_write(
            request=request, metadata=client._rpc_metadata, retry=None, timeout=10
        )

    def serialized(writes: list[Any]) -> bytes:  # as the store sends them: each write once
        return request(database, [write.SerializeToString() for write in writes])

    def raw(writes: list[Any]) -> Any:
        return call(serialized(writes), timeout=10, metadata=metadata)

    def raw_future(writes: list[Any]) -> Any:
        done = threading.Event()
        future = call.future(serialized(writes), timeout=10, metadata=metadata)
        future.add_done_callback(lambda _: done.set())
        done.wait()
        return future.result()

    commit_request = firestore_types.CommitRequest.pb()
    commit = api._transport.grpc_channel.unary_unary(
        "/google.firestore.v1.Firestore/Commit",
        request_serializer=commit_request.SerializeToString,
        response_deserializer=firestore_types.CommitResponse.pb().FromString,
    )

    def empty_commit(writes: list[Any]) -> Any:
        return commit(commit_request(database=database), timeout=10, metadata=metadata)

    def through(channel: grpc.Channel) -> Callable[[list[Any]], Any]:
        wrapped_call: Any = channel.unary_unary(
            "/google.firestore.v1.Firestore/BatchWrite",
            request_serializer=None,
            response_deserializer=firestore_types.BatchWriteResponse.pb().FromString,
        )
        return lambda writes: wrapped_call(serialized(writes), timeout=10, metadata=metadata)

    channel = api._transport.grpc_channel
    return {
        "generated": generated,
        "raw": raw,
        "raw-future": raw_future,
        "write-stream": _WriteStream(client, metadata),
        "rest": _Rest(database),
        "empty-commit": empty_commit,
        "raw-intercepted": through(grpc.intercept_channel(channel, _Counting())),
        "raw-counted": through(RpcCounter().intercept(channel)),
    }


class _Counting(grpc.UnaryUnaryClientInterceptor):
    """Counts as :class:`~benchmarks.counting.RpcCounter` does, from inside an interceptor (how
    the benchmark counted RPCs before): what the interceptor's layers add."""

    def __init__(self) -> None:
        self._counter = RpcCounter()

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        method = short_method(client_call_details.method)
        self._counter.count(method, request)
        started = time.perf_counter()
        try:
            return continuation(client_call_details, request)
        finally:
            self._counter.waited(method, started)


class _Rest:
    """Batches as JSON over HTTP/1.1 to the emulator's REST endpoint, one kept-alive connection."""

    def __init__(self, database: str) -> None:
        host, port = os.environ["FIRESTORE_EMULATOR_HOST"].rsplit(":", 1)
        self._connection = http.client.HTTPConnection(host, int(port), timeout=10)
        self._path = f"/v1/{database}/documents:batchWrite"
        self._headers = {"Content-Type": "application/json", "Authorization": "Bearer owner"}

    @staticmethod
    def prepare(writes: list[Any]) -> Any:
        """The writes as the JSON objects of the REST API, built before the timing (as the
        protobufs are for the other ways)."""
        return [MessageToDict(write) for write in writes]

    def __call__(self, writes: list[Any]) -> Any:
        body = json.dumps({"writes": writes}).encode()
        self._connection.request("POST", self._path, body, self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"batchWrite over REST: {response.status} {answer[:200]!r}")
        return json.loads(answer)


class _WriteStream:
    """Batches sent on one ``Write`` stream: a request each, its response awaited."""

    def __init__(self, client: Any, metadata: Sequence[tuple[str, str]]) -> None:
        from google.cloud.firestore_v1.types import firestore as firestore_types  # noqa: PLC0415

        self._request = firestore_types.WriteRequest.pb()
        response = firestore_types.WriteResponse.pb()
        channel = client._firestore_api._transport.grpc_channel
        call = channel.stream_stream(
            "/google.firestore.v1.Firestore/Write",
            request_serializer=self._request.SerializeToString,
            response_deserializer=response.FromString,
        )
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self._responses = call(iter(self._outgoing.get, None), metadata=metadata)
        self._outgoing.put(self._request(database=client._database_string))  # opens the stream
        self._token = next(self._responses).stream_token

    def __call__(self, writes: list[Any]) -> Any:
        self._outgoing.put(self._request(stream_token=self._token, writes=writes))
        answer = next(self._responses)
        self._token = answer.stream_token
        if len(answer.write_results) != len(writes):
            raise RuntimeError("the Write stream answered another number of writes")
        return answer

    def close(self) -> None:
        self._outgoing.put(None)  # ends the request iterator: the stream half-closes


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rpc_cost")
    parser.add_argument("--calls", type=int, default=600, help="RPCs per measurement (600)")
    parser.add_argument("--writes", type=int, default=2, help="writes per RPC (2)")
    args = parser.parse_args(argv)
    with emulators("pubsub-worker-rpc-cost"):
        from google.cloud import firestore  # noqa: PLC0415

        from pubsub_worker.stores._writes import create_write  # noqa: PLC0415

        client = firestore.Client(project="pubsub-worker-rpc-cost")
        prefix = f"{client._database_string}/documents/rpc-cost"

        def batches(count: int) -> list[list[Any]]:
            return [
                [
                    create_write(f"{prefix}/{uuid.uuid4().hex}", {"epoch": 1, "state": "running"})
                    for _ in range(args.writes)
                ]
                for _ in range(count)
            ]

        senders = _senders(client)
        print(f"{args.calls} BatchWrite RPCs of {args.writes} writes, one thread, per RPC:")
        for round_ in (1, 2):
            for name, send in senders.items():
                prepare = getattr(send, "prepare", lambda writes: writes)
                for writes in batches(50):  # warm the path
                    send(prepare(writes))
                todo = [prepare(writes) for writes in batches(args.calls)]
                cpu, own = time.process_time(), time.thread_time()
                wall = time.perf_counter()
                for writes in todo:
                    send(writes)
                cpu_ms = (time.process_time() - cpu) * 1000 / args.calls
                own_ms = (time.thread_time() - own) * 1000 / args.calls
                wall_ms = (time.perf_counter() - wall) * 1000 / args.calls
                print(
                    f"  round {round_} {name:<12} CPU {cpu_ms:.3f} ms (the sending thread "
                    f"{own_ms:.3f})  wall {wall_ms:.3f} ms"
                )
        for send in senders.values():
            if isinstance(send, _WriteStream):
                send.close()
        client.close()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
