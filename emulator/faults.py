"""Fault injection between a client and an emulator: a small TCP proxy.

Point ``PUBSUB_EMULATOR_HOST`` or ``FIRESTORE_EMULATOR_HOST`` of the process
under test at :attr:`TcpProxy.address` instead of the emulator, then:

* :meth:`TcpProxy.cut` resets every live connection (both sides get a TCP
  RST): in-flight calls fail with ``UNAVAILABLE``, the client reconnects
  through the proxy and later calls succeed again.
* :meth:`TcpProxy.blackhole` stops forwarding in both directions while on.
  Connections stay open and new ones are accepted, but no byte goes through:
  calls hang until their deadline, as in a network partition. Bytes sent
  meanwhile are held, not lost (as TCP retransmission would deliver them
  once a partition heals); call :meth:`cut` as well to lose them.
* :meth:`TcpProxy.delay` holds every chunk of bytes it forwards for half a
  round trip, in each direction, and keeps their order: the network between
  a client and a service in production, on loopback. Over gRPC (HTTP/2 on
  one connection) a unary call pays one round trip: its request half, its
  answer half. A message the server sends on a stream arrives half a round
  trip later, and so does what the client sends on it; HTTP/2's own frames
  (settings, pings, window updates) are held alike, as a real network would.

One named daemon thread runs a selector loop that owns every socket; the
public methods post commands to it and wait until they took effect.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from emulator.delay import DelayLine

__all__ = ["TcpProxy"]

logger = logging.getLogger(__name__)

_CHUNK = 65536
_MAX_BUFFERED = 1 << 20  # bytes held per direction before reading from the source pauses
_T = TypeVar("_T")
_LISTEN = object()
_WAKE = object()


def _abort(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a RST, not a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Connection:
    """A client socket and its upstream socket, with bytes pending for each.

    Bytes read from one side wait in ``held`` (while a delay is on) until
    their time comes, then in ``pending`` until the other side takes them.
    """

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.peer = {client: upstream, upstream: client}
        self.pending = {client: bytearray(), upstream: bytearray()}  # to be written TO key
        self.held = {client: DelayLine(), upstream: DelayLine()}  # to be written TO key, later
        self.eof: set[socket.socket] = set()  # sockets whose peer closed its sending side
        self.registered: dict[socket.socket, int] = {}

    @property
    def sockets(self) -> tuple[socket.socket, socket.socket]:
        client, upstream = self.peer
        return client, upstream

    def queued(self, sock: socket.socket) -> int:
        """Bytes still to be written to ``sock``, held or pending."""
        return len(self.pending[sock]) + self.held[sock].size

    def release(self, now: float) -> bool:
        """Move the held chunks whose moment came to ``pending``; True if any moved."""
        moved = False
        for sock, line in self.held.items():
            if data := line.release(now):
                self.pending[sock] += data
                moved = True
        return moved


class TcpProxy:
    """Forward a free loopback port to ``target`` (``"host:port"``), with faults on demand.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, target: str, *, listen_host: str = "127.0.0.1") -> None:
        host, _, port = target.rpartition(":")
        self.target = (host or "127.0.0.1", int(port))
        self._listener = socket.create_server((listen_host, 0))
        self._listener.setblocking(False)
        self.host: str = listen_host
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # Owned by the loop thread only: _connections, _blackholed, _one_way_s, registrations.
        self._connections: list[_Connection] = []
        self._blackholed = False
        self._one_way_s = 0.0
        self._closed = threading.Event()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTEN)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(
            target=self._run, name=f"tcp-proxy-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        """``host:port`` to give the client instead of the target."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """Number of live proxied connections."""
        return self._call(lambda: len(self._connections))

    def cut(self) -> int:
        """Reset every live connection (RST to both sides); return how many."""

        def cut_all() -> int:
            count = len(self._connections)
            for conn in list(self._connections):
                self._drop(conn)
            return count

        count = self._call(cut_all)
        logger.info("proxy %s -> %s:%d: cut %d connections", self.address, *self.target, count)
        return count

    def blackhole(self, on: bool = True) -> None:
        """Stop (``on=True``) or resume (``on=False``) forwarding bytes."""

        def apply() -> None:
            self._blackholed = on
            for conn in self._connections:
                self._update(conn)

        self._call(apply)
        logger.info("proxy %s: blackhole %s", self.address, "on" if on else "off")

    def delay(self, round_trip_s: float) -> None:
        """Add ``round_trip_s`` seconds to every round trip through the proxy (0: none).

        Each chunk read from either side is written to the other no earlier
        than half of ``round_trip_s`` after it was read (a fraction of a
        millisecond later on an idle machine), and never before a chunk read
        earlier in the same direction. Applies to bytes read from now
        on, on live connections and new ones. A close is passed on once the
        bytes before it were delivered.
        """
        if not round_trip_s >= 0:  # also refuses NaN
            raise ValueError(f"round_trip_s must be >= 0 seconds, got {round_trip_s!r}")

        def apply() -> None:
            self._one_way_s = round_trip_s / 2

        self._call(apply)
        logger.info("proxy %s: round trip delay %.1f ms", self.address, round_trip_s * 1000)

    def close(self) -> None:
        """Stop listening and reset every connection. Idempotent."""
        if self._closed.is_set():
            return
        with contextlib.suppress(RuntimeError):
            self.cut()
        self._closed.set()
        self._wake()
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- loop-thread side -------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the loop thread and return its result."""
        if threading.current_thread() is self._thread:
            return fn()
        if self._closed.is_set():
            raise RuntimeError(f"proxy {self.address} is closed")
        done = threading.Event()
        box: list[_T] = []
        failure: list[BaseException] = []

        def command() -> None:
            try:
                box.append(fn())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
            finally:
                done.set()

        self._commands.put(command)
        self._wake()
        if not done.wait(timeout=10):
            raise RuntimeError(f"proxy {self.address} did not respond")
        if failure:
            raise failure[0]
        return box[0]

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                for key, mask in self._selector.select(timeout=self._timeout()):
                    if key.data is _LISTEN:
                        self._accept()
                    elif key.data is _WAKE:
                        self._drain_commands()
                    else:
                        self._service(key.data, key.fileobj, mask)  # type: ignore[arg-type]
                self._release_due()
        except Exception:  # pragma: no cover - a bug here must not pass silently
            logger.exception("proxy %s loop crashed", self.address)
        finally:
            for conn in list(self._connections):
                self._drop(conn)
            self._drain_commands()
            self._selector.close()
            for sock in (self._listener, self._wake_r, self._wake_w):
                sock.close()

    def _next_due(self) -> float | None:
        """When the oldest held chunk of any connection may go (None: nothing held)."""
        due = [
            moment
            for conn in self._connections
            for line in conn.held.values()
            if (moment := line.due) is not None
        ]
        return min(due, default=None)

    def _timeout(self) -> float:
        """How long the selector may wait: at most until the next held chunk is due.

        In whole milliseconds rounded down (the selector rounds up: it would
        wake up to a millisecond late); :meth:`_release_due` sleeps the rest.
        """
        due = self._next_due()
        if due is None:
            return 0.5
        return min(math.floor(max(due - time.monotonic(), 0.0) * 1000) / 1000, 0.5)

    def _release_due(self) -> None:
        """Hand the held chunks whose time came to their sockets."""
        due = self._next_due()
        if due is not None and 0 < (left := due - time.monotonic()) < 0.001:
            time.sleep(left)  # finer than the selector's milliseconds
        now = time.monotonic()
        for conn in list(self._connections):
            if conn.release(now):
                if not self._blackholed:
                    self._flush(conn)
                self._update(conn)

    def _drain_commands(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2.0)
        except OSError as exc:
            logger.warning("proxy %s: upstream %s:%d refused: %s", self.address, *self.target, exc)
            _abort(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(client, upstream)
        self._connections.append(conn)
        self._update(conn)

    def _service(self, conn: _Connection, sock: socket.socket, mask: int) -> None:
        if conn not in self._connections:
            return
        peer = conn.peer[sock]
        try:
            if mask & selectors.EVENT_READ:
                data = sock.recv(_CHUNK)
                if not data:
                    conn.eof.add(sock)
                elif self._one_way_s or conn.held[peer]:
                    conn.held[peer].hold(data, time.monotonic() + self._one_way_s)
                else:
                    conn.pending[peer] += data
            if mask & selectors.EVENT_WRITE and conn.pending[sock]:
                sent = sock.send(conn.pending[sock])
                del conn.pending[sock][:sent]
            if not self._blackholed:
                self._flush(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # One side reset or failed: pass the reset on to the other side.
            self._drop(conn)
            return
        self._update(conn)

    def _flush(self, conn: _Connection) -> None:
        """Half-close a side once its peer sent EOF and everything was delivered."""
        for sock in conn.sockets:
            peer = conn.peer[sock]
            if sock in conn.eof and not conn.queued(peer):
                with contextlib.suppress(OSError):
                    peer.shutdown(socket.SHUT_WR)
        if len(conn.eof) == 2 and not any(conn.queued(s) for s in conn.sockets):
            self._drop(conn, graceful=True)

    def _update(self, conn: _Connection) -> None:
        """Register each socket for what it should wait for now."""
        if conn not in self._connections:
            return
        for sock in conn.sockets:
            peer = conn.peer[sock]
            events = 0
            if not self._blackholed:
                if sock not in conn.eof and conn.queued(peer) < _MAX_BUFFERED:
                    events |= selectors.EVENT_READ
                if conn.pending[sock]:
                    events |= selectors.EVENT_WRITE
            current = conn.registered.get(sock, 0)
            if events == current:
                continue
            if current and events:
                self._selector.modify(sock, events, conn)
            elif events:
                self._selector.register(sock, events, conn)
            else:
                self._selector.unregister(sock)
            conn.registered[sock] = events

    def _drop(self, conn: _Connection, *, graceful: bool = False) -> None:
        if conn not in self._connections:
            return
        self._connections.remove(conn)
        for sock in conn.sockets:
            if conn.registered.get(sock):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
            if graceful:
                sock.close()
            else:
                _abort(sock)
