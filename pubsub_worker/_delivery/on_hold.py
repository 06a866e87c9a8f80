"""Messages a stock client holds while its stream runs: released, not left to wait.

The stock client (google-cloud-pubsub 2.x) keeps the messages of a pull
response that flow control has no room for *on hold*, leased, and releases
them as earlier ones settle, but only while its stream is paused: each
settlement calls its ``maybe_resume_consumer()``, which does nothing unless
the stream is paused. Its ``_on_response()`` releases what fits, leaves its
lock and only then pauses the stream if the load is full. A message settled
in between (a fast job; the settlement runs on another thread) brings the
load under the limit before the pause, so the stream is never paused, and
every later settlement finds it running: the messages on hold stay there
until the next pull response releases them. After a burst none comes; they
wait, their leases renewed, until flow control's ``max_lease_duration``
drops them (an hour at the client's defaults) and Pub/Sub delivers them again.

Seen in the benchmark run: one process of four ended a backlog with 69
messages on hold and none in its callbacks. :class:`OnHold` remembers
the streaming pull managers of the messages received and, once a lease
keeper's pass (about a second), releases for each what its load allows,
under the client's own lock, as the client's paused path does. A client that
lacks these internals (another major version) is left alone.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from pubsub_worker._support.metrics import Counter, Metrics

from .acks import manager_of

__all__ = ["OnHold", "release_held"]

_LOGGER = logging.getLogger(__name__)

_MAX_LOAD = 1.0
"""The client's full load (``streaming_pull_manager._MAX_LOAD``): nothing is released at it."""


class OnHold:
    """The stock clients' streaming pull managers seen, and their held messages released."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()  # guards _managers
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last: weakref.ReferenceType[Any] | None = None
        self._failed = False  # a release raised once: the client's own release stays, no more

    def note(self, message: Any) -> None:
        """Remember the manager ``message`` came from (a stock client's; others are ignored)."""
        manager = manager_of(message)
        if manager is None:
            return
        last = self._last
        if last is not None and last() is manager:
            return  # the one manager of a worker, seen already: the common case, no lock
        with self._lock:
            self._managers.add(manager)
            self._last = weakref.ref(manager)

    def release(self) -> int:
        """Release what each manager's load allows of its held messages; how many.

        A release that raises (a client whose internals differ from these) is
        logged once, with its traceback, and never tried again in this process.
        """
        if self._failed:
            return 0
        with self._lock:
            managers = list(self._managers)
        try:
            released = sum(release_held(manager) for manager in managers)
        except Exception:
            self._failed = True
            _LOGGER.exception(
                "releasing the Pub/Sub client's held messages failed; left to the client "
                "from now on (it releases them with its next pull response)"
            )
            return 0
        if released and self._metrics is not None:
            self._metrics.inc(Counter.HELD_RELEASED, released)
        return released


def release_held(manager: Any) -> int:
    """Release ``manager``'s held messages as far as its load allows; how many were."""
    held = getattr(manager, "_messages_on_hold", None)
    lock = getattr(manager, "_pause_resume_lock", None)
    release = getattr(manager, "_maybe_release_messages", None)
    if held is None or lock is None or release is None or not held.size:
        return 0
    with lock:
        if manager._consumer is None or manager._scheduler is None or manager._leaser is None:
            return 0  # closing (its consumer goes first) or closed: it nacks what it holds
        before = held.size
        if not before or manager.load >= _MAX_LOAD:
            return 0  # full: the settlements to come release them, or the next pass
        release()
        released = int(before - held.size)
    manager.maybe_pause_consumer()
    if released:
        _LOGGER.info(
            "released %d message(s) the Pub/Sub client held with its stream running "
            "(subscription %s): it releases held messages only while paused",
            released,
            getattr(manager, "_subscription", "?"),
        )
    return released
