"""What Pub/Sub did with the fleet's messages, as seen at the gRPC proxy.

Every delivery (a message in a ``StreamingPull`` response) and every ack
the emulator accepted passes through :class:`~benchmarks.chaos.grpc_proxy.GrpcFaultProxy`,
whichever worker sent it and whether or not the worker lived to see the
answer. The ledger keeps, per message id, the deliveries and whether an ack
of it was accepted: a redelivery count that survives SIGKILL, and the
signal that the fleet is drained (every job message acked). An ack the
emulator refused for some ack ids (exactly-once ``ErrorInfo`` trailer)
counts as accepted for the others only.

The final word on "nothing left unacked" is not this ledger but a pull on
the subscription after the fleet stopped (:mod:`benchmarks.chaos.run`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
from google.pubsub_v1.types import (
    AcknowledgeRequest,
    ModifyAckDeadlineRequest,
    StreamingPullResponse,
)
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

__all__ = ["ACKNOWLEDGE", "MODIFY_ACK_DEADLINE", "STREAMING_PULL", "Ledger"]

_SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
ACKNOWLEDGE = _SUBSCRIBER + "Acknowledge"
MODIFY_ACK_DEADLINE = _SUBSCRIBER + "ModifyAckDeadline"
STREAMING_PULL = _SUBSCRIBER + "StreamingPull"

_PULL_RESPONSE = StreamingPullResponse.pb()
_ACK_REQUEST = AcknowledgeRequest.pb()
_MODACK_REQUEST = ModifyAckDeadlineRequest.pb()


def refused_ack_ids(call: grpc.Call) -> set[str] | None:
    """The ack ids an exactly-once ``ErrorInfo`` trailer names; None when it names none.

    None means the whole request failed (no per-id verdict).
    """
    for key, value in call.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.metadata:
                return set(info.metadata)
    return None


class Ledger:
    """Deliveries and accepted acks per message id of one subscription. Thread-safe.

    Implements :class:`~benchmarks.chaos.grpc_proxy.Observer`.
    """

    def __init__(self, subscription_path: str) -> None:
        self.subscription_path = subscription_path
        self._lock = threading.Lock()  # guards everything below
        self._deliveries: Counter[str] = Counter()
        self._delivered_at: dict[str, list[tuple[float, str]]] = {}  # id -> (wall time, worker)
        self._message_of: dict[str, str] = {}  # ack id -> message id
        self._acked: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._opened: dict[str, float] = {}  # worker -> wall time of its last stream opened

    # -- Observer -------------------------------------------------------------------

    def for_worker(self, worker: str) -> _WorkerView:
        """The observer of one worker's proxy: deliveries are recorded with its name."""
        return _WorkerView(self, worker)

    def streamed(self, method: str, response: bytes, worker: str = "?") -> None:
        if method != STREAMING_PULL:
            return
        parsed = _PULL_RESPONSE.FromString(response)
        now = time.time()
        with self._lock:
            for received in parsed.received_messages:
                message_id = received.message.message_id
                self._deliveries[message_id] += 1
                self._delivered_at.setdefault(message_id, []).append((now, worker))
                self._message_of[received.ack_id] = message_id

    def opened(self, method: str, worker: str = "?") -> None:
        if method == STREAMING_PULL:
            with self._lock:
                self._opened[worker] = time.time()

    def pulling_since(self, worker: str, since: float) -> bool:
        """Whether ``worker`` opened a streaming pull after ``since`` (wall time)."""
        with self._lock:
            return self._opened.get(worker, 0.0) > since

    def answered(self, method: str, request: bytes, error: grpc.Call | None) -> None:
        if method == ACKNOWLEDGE:
            ack = _ACK_REQUEST.FromString(request)
            if ack.subscription != self.subscription_path:
                return
            accepted = set(ack.ack_ids)
            if error is not None:
                refused = refused_ack_ids(error)
                accepted = accepted - refused if refused is not None else set()
            with self._lock:
                self._counts["acks"] += len(ack.ack_ids)
                self._counts["acks_refused"] += len(ack.ack_ids) - len(accepted)
                for ack_id in accepted:
                    message_id = self._message_of.get(ack_id)
                    if message_id is not None:
                        self._acked.add(message_id)
        elif method == MODIFY_ACK_DEADLINE:
            modack = _MODACK_REQUEST.FromString(request)
            if modack.subscription != self.subscription_path:
                return
            kind = "nacks" if modack.ack_deadline_seconds == 0 else "modacks"
            with self._lock:
                self._counts[kind] += len(modack.ack_ids)
                if error is not None:
                    self._counts[f"{kind}_refused"] += len(modack.ack_ids)

    # -- reading ----------------------------------------------------------------------

    def deliveries(self) -> dict[str, int]:
        """Deliveries per message id so far."""
        with self._lock:
            return dict(self._deliveries)

    def delivered_at(self, message_id: str) -> list[tuple[float, str]]:
        """``(wall time, worker)`` of each delivery of ``message_id``."""
        with self._lock:
            return list(self._delivered_at.get(message_id, ()))

    def acked(self) -> set[str]:
        """Message ids with an accepted ack."""
        with self._lock:
            return set(self._acked)

    def unacked(self, message_ids: set[str]) -> set[str]:
        """Which of ``message_ids`` have no accepted ack yet."""
        with self._lock:
            return message_ids - self._acked

    def counts(self) -> dict[str, int]:
        """Acks, refused acks, lease modacks, nacks seen (by ack id)."""
        with self._lock:
            return dict(self._counts)


class _WorkerView:
    """A :class:`Ledger` as one worker's proxy sees it."""

    def __init__(self, ledger: Ledger, worker: str) -> None:
        self._ledger = ledger
        self._worker = worker

    def streamed(self, method: str, response: bytes) -> None:
        self._ledger.streamed(method, response, self._worker)

    def answered(self, method: str, request: bytes, error: grpc.Call | None) -> None:
        self._ledger.answered(method, request, error)

    def opened(self, method: str) -> None:
        self._ledger.opened(method, self._worker)
