"""TcpProxy.delay: every round trip through it takes at least the delay; bytes arrive intact,
in order, and the close after them.

Only lower bounds on time are asserted: the delay is a floor the proxy must keep, whatever
else the machine does; how much later bytes arrive on a busy machine is not a property.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from google.pubsub_v1.types import ListTopicsRequest, ListTopicsResponse

from emulator import Emulators, TcpProxy


@contextmanager
def _echo_server() -> Iterator[str]:
    """A loopback server that sends back every byte it gets, then closes after the client."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, name="echo-server", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(timeout=10)
        listener.close()


def _receive(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def test_a_round_trip_takes_at_least_the_delay() -> None:
    with _echo_server() as target, TcpProxy(target) as proxy:
        proxy.delay(0.2)
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert _receive(sock, 4) == b"ping"
            assert time.monotonic() - started >= 0.2
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""  # the close came through, after the bytes


def test_bytes_arrive_intact_and_in_order_and_the_close_after_them() -> None:
    sent = os.urandom(3 * 1024 * 1024)  # more than the proxy buffers per direction
    with _echo_server() as target, TcpProxy(target) as proxy:
        proxy.delay(0.02)
        with socket.create_connection((proxy.host, proxy.port), timeout=30) as sock:

            def send() -> None:
                for start in range(0, len(sent), 7919):  # uneven pieces
                    sock.sendall(sent[start : start + 7919])
                sock.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send, name="echo-sender", daemon=True)
            sender.start()
            received = _receive(sock, len(sent) + 1)  # one more: the close must come after
            sender.join(timeout=10)
    assert len(received) == len(sent)
    assert received == sent


def test_a_shorter_delay_never_lets_bytes_overtake_those_held_before_them() -> None:
    with _echo_server() as target, TcpProxy(target) as proxy:
        proxy.delay(0.8)  # 0.4 s each way
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"A")
            time.sleep(0.1)  # the proxy holds "A" on its way to the server
            proxy.delay(0)
            sock.sendall(b"B")
            assert _receive(sock, 2) == b"AB"
            # "B" came back no earlier than "A" reached the server: it waited behind it.
            assert time.monotonic() - started >= 0.4


def test_a_negative_or_undefined_delay_is_refused() -> None:
    with TcpProxy("127.0.0.1:9") as proxy:  # nothing connects: the target is never dialled
        with pytest.raises(ValueError, match="round_trip_s must be >= 0"):
            proxy.delay(-0.01)
        with pytest.raises(ValueError, match="round_trip_s must be >= 0"):
            proxy.delay(float("nan"))


@pytest.mark.emulator
def test_a_unary_rpc_through_the_delay_pays_one_round_trip(emulators: Emulators) -> None:
    assert emulators.pubsub_host is not None
    request = ListTopicsRequest(project=f"projects/{emulators.project}")
    with TcpProxy(emulators.pubsub_host) as proxy, grpc.insecure_channel(proxy.address) as ch:
        call = ch.unary_unary(
            "/google.pubsub.v1.Publisher/ListTopics",
            request_serializer=ListTopicsRequest.serialize,
            response_deserializer=ListTopicsResponse.deserialize,
        )
        call(request, timeout=10)  # connected, before the delay
        proxy.delay(0.15)
        started = time.monotonic()
        assert isinstance(call(request, timeout=10), ListTopicsResponse)
        assert time.monotonic() - started >= 0.15
