"""The downstream consumer: reads a topic's subscription and keeps each effect key once.

It is what a consumer with ``PUBSUB_WORKER_KEY_ATTRIBUTE=effect_key`` does
with the fleet's outputs: the first message of an effect key is the
effect; every later copy (an outbox entry republished after a crash
between its publish and its ``sent`` mark) is dropped, and counted here.
The same class reads the failure topic, keyed on the job key.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from google.api_core import exceptions as gexc

__all__ = ["KeyedConsumer"]

_BATCH = 500


class KeyedConsumer:
    """Pulls and acks ``subscription_path`` on a daemon thread; counts copies per key.

    Attributes:
        copies: Messages received per key (1 is one effect; more are dropped copies).
        jobs: Per key, the ``job`` attribute of its first message.
        first_seen: Per key, the wall time its first message was received.
        unkeyed: Messages without the key attribute.
    """

    def __init__(self, subscriber: Any, subscription_path: str, *, key_attribute: str) -> None:
        self._subscriber = subscriber
        self.subscription_path = subscription_path
        self.key_attribute = key_attribute
        self._lock = threading.Lock()  # guards copies, jobs, first_seen, unkeyed, _last
        self.copies: Counter[str] = Counter()
        self.jobs: dict[str, str] = {}
        self.first_seen: dict[str, float] = {}
        self.unkeyed = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"chaos-consumer-{key_attribute}", daemon=True
        )

    def start(self) -> None:
        """Start pulling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop pulling (what is not pulled yet stays on the subscription). Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)

    def drain(self, quiet_s: float = 2.0, limit_s: float = 60.0) -> None:
        """Pull until nothing arrived for ``quiet_s`` (at most ``limit_s``), then stop."""
        deadline = time.monotonic() + limit_s
        if not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        while time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self._last
            if idle >= quiet_s:
                break
            time.sleep(0.2)
        self.stop()

    def snapshot(self) -> tuple[dict[str, int], dict[str, str], int]:
        """``(copies, jobs, unkeyed)`` so far."""
        with self._lock:
            return dict(self.copies), dict(self.jobs), self.unkeyed

    def first_seen_at(self) -> dict[str, float]:
        """Wall time each key's first message was received, so far."""
        with self._lock:
            return dict(self.first_seen)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                response = self._subscriber.pull(
                    request={
                        "subscription": self.subscription_path,
                        "max_messages": _BATCH,
                        "return_immediately": True,
                    },
                    timeout=10,
                )
            except (gexc.DeadlineExceeded, gexc.ServiceUnavailable):
                continue
            received = list(response.received_messages)
            if not received:
                self._stop.wait(0.2)
                continue
            self._record([message.message for message in received])
            self._subscriber.acknowledge(
                request={
                    "subscription": self.subscription_path,
                    "ack_ids": [message.ack_id for message in received],
                },
                timeout=10,
            )

    def _record(self, messages: list[Any]) -> None:
        with self._lock:
            self._last = time.monotonic()
            for message in messages:
                key = message.attributes.get(self.key_attribute)
                if key is None:
                    self.unkeyed += 1
                    continue
                self.copies[key] += 1
                self.jobs.setdefault(key, message.attributes.get("job", ""))
                self.first_seen.setdefault(key, time.time())
