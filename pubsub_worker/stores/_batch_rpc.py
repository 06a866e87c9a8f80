"""The raw ``BatchWrite`` RPC: its method on the client's channel, its request, its outcomes.

The request is sent raw on the Firestore client's own gRPC channel, with the
metadata its generated client sends (resource prefix, routing header, client
info, the emulator's token), skipping the generated client's wrapped method
(proto-plus, ``api_core``'s retry and timeout layers, its logging channel);
``python -m benchmarks.rpc_cost`` measures the difference
(``docs/benchmarks-history.md``). Each write is serialized once, as it is queued
(its size counts against the request's cap), and the request is those bytes
framed after its database field (:func:`request`): no write is copied into a
request message and serialized again. ``BatchWrite`` is not atomic: the
response carries a status and an update time per write, and :func:`outcomes`
reads them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.api_core import gapic_v1
from google.cloud import firestore
from google.cloud.firestore_v1.types import firestore as firestore_types
from proto.datetime_helpers import DatetimeWithNanoseconds  # type: ignore[import-untyped]

from ._queued import QueuedWrite
from .base import Version

__all__ = ["batch_write_call", "failed", "field", "outcomes", "request", "send_batch"]

_LOGGER = logging.getLogger(__name__)
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_METHOD = "/google.firestore.v1.Firestore/BatchWrite"
_RESPONSE = firestore_types.BatchWriteResponse.pb()

Outcome = tuple[Version | None, BaseException | None]
"""One write's new update time, or its error."""


def batch_write_call(client: firestore.Client) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """The ``BatchWrite`` method on the client's gRPC channel, and the metadata to send.

    The channel is the generated client's own (the emulator's, or the one
    with the project's credentials); the metadata is what its wrapped method
    adds to ``client._rpc_metadata``: the routing header and the client info.
    """
    transport = client._firestore_api._transport
    call = transport.grpc_channel.unary_unary(
        _METHOD,
        request_serializer=None,  # the request is sent as serialized (:func:`request`)
        response_deserializer=_RESPONSE.FromString,
    )
    routing = gapic_v1.routing_header.to_grpc_metadata(  # type: ignore[no-untyped-call]
        (("database", client._database_string),)
    )
    info = client._client_info.to_grpc_metadata()
    return call, (*client._rpc_metadata, routing, info)


def send_batch(
    call: Any,
    batch: Sequence[QueuedWrite],
    *,
    database: str,
    timeout: float,
    metadata: tuple[tuple[str, str], ...],
) -> None:
    """Send one ``BatchWrite`` of the queued writes and settle each with its own outcome."""
    sent = request(database, [w.data for w in batch])
    try:
        response = call(sent, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        error = failed(exc)
        _LOGGER.debug("BatchWrite of %d writes failed: %s", len(batch), error)
        for write in batch:
            write.settle(None, error)
        return
    for write, (version, write_error) in zip(batch, outcomes(response, len(batch)), strict=True):
        write.settle(version, write_error)


def request(database: str, writes: Sequence[bytes]) -> bytes:
    """A serialized ``BatchWriteRequest`` of serialized ``Write`` protobufs.

    Its fields in number order, as a protobuf serializer writes them:
    ``database`` (1), then each of ``writes`` (2, repeated).
    """
    return b"".join([_database_field(database), *[field(2, write) for write in writes]])


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: its tag, the payload's length as a varint, the
    payload (as many bytes as :func:`~pubsub_worker.stores._writes.framed_bytes` counts;
    field numbers below 16)."""
    size = len(payload)
    head = bytearray(((number << 3) | 2,))
    while size > 0x7F:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + payload


@functools.lru_cache(maxsize=8)
def _database_field(database: str) -> bytes:
    return field(1, database.encode())


def failed(error: grpc.RpcError) -> BaseException:
    """The whole RPC's failure as the ``GoogleAPICallError`` each of its writes raises."""
    return gexc.from_grpc_error(error)  # type: ignore[no-untyped-call, no-any-return]


def outcomes(response: Any, count: int) -> list[Outcome]:
    """Each of the ``count`` writes' outcome, in order, from a raw ``BatchWriteResponse``.

    A write without a status of its own, or with an OK status but no update
    time, is an ``Unknown`` error: its outcome is not known.
    """
    results, statuses = response.write_results, response.status
    found: list[Outcome] = []
    for index in range(count):
        code = statuses[index].code if index < len(statuses) else 0
        if code == 0 and index < len(results) and results[index].HasField("update_time"):
            # The class the library's own reads return, so versions compare equal.
            found.append(
                (DatetimeWithNanoseconds.from_timestamp_pb(results[index].update_time), None)
            )
            continue
        if code == 0:
            code, message = grpc.StatusCode.UNKNOWN.value[0], "no update time for the write"
        else:
            message = statuses[index].message
        status = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
        found.append((None, gexc.from_grpc_status(status, message)))  # type: ignore[no-untyped-call]
    return found
