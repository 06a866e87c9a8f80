"""TcpProxy: real gRPC calls through it, cut and blackholed."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from google.pubsub_v1.types import ListTopicsRequest, ListTopicsResponse

from emulator import Emulators, TcpProxy

pytestmark = pytest.mark.emulator


def _list_topics(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        "/google.pubsub.v1.Publisher/ListTopics",
        request_serializer=ListTopicsRequest.serialize,
        response_deserializer=ListTopicsResponse.deserialize,
    )


def test_cut_fails_the_call_in_flight_and_the_client_recovers(emulators: Emulators) -> None:
    assert emulators.pubsub_host is not None
    request = ListTopicsRequest(project=f"projects/{emulators.project}")
    with TcpProxy(emulators.pubsub_host) as proxy, grpc.insecure_channel(proxy.address) as ch:
        call = _list_topics(ch)
        call(request, timeout=5)
        assert proxy.connections == 1

        proxy.blackhole(True)
        with pytest.raises(grpc.RpcError) as hung:
            call(request, timeout=0.5)
        assert hung.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        in_flight = call.future(request, timeout=10)
        time.sleep(0.3)
        assert not in_flight.done()
        assert proxy.cut() == 1
        failure = in_flight.exception(timeout=5)
        assert isinstance(failure, grpc.RpcError)
        assert failure.code() == grpc.StatusCode.UNAVAILABLE
        assert proxy.connections == 0

        proxy.blackhole(False)
        _recovered(call, request)  # reconnects through the proxy
        assert proxy.connections == 1


def test_blackhole_holds_bytes_until_lifted(emulators: Emulators) -> None:
    assert emulators.pubsub_host is not None
    request = ListTopicsRequest(project=f"projects/{emulators.project}")
    with TcpProxy(emulators.pubsub_host) as proxy, grpc.insecure_channel(proxy.address) as ch:
        call = _list_topics(ch)
        call(request, timeout=5)
        proxy.blackhole(True)
        pending = call.future(request, timeout=10)
        time.sleep(0.5)
        assert not pending.done()
        proxy.blackhole(False)
        assert isinstance(pending.result(timeout=5), ListTopicsResponse)


def test_closed_proxy_refuses_connections(emulators: Emulators) -> None:
    assert emulators.pubsub_host is not None
    proxy = TcpProxy(emulators.pubsub_host)
    address = proxy.address
    proxy.close()
    proxy.close()  # idempotent
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as info:
        _list_topics(ch)(ListTopicsRequest(project="projects/x"), timeout=2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _recovered(call: Any, request: ListTopicsRequest) -> None:
    """The client reconnects: a call may first meet the cut connection's last write
    (``UNAVAILABLE``, broken pipe), as gRPC allows; the next one goes through."""
    for attempt in range(3):
        try:
            call(request, timeout=5, wait_for_ready=True)
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == 2:
                raise
