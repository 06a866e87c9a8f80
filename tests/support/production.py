"""What the test worker processes change so that they take production's paths."""

from __future__ import annotations

from pubsub_worker._delivery import acks

__all__ = ["production_acks"]


def production_acks() -> None:
    """Acks go straight to Pub/Sub, as they do at production's round trips.

    The wrapper sends a stock client's acks itself while its ``Acknowledge``
    round trips average 5 ms or more (:mod:`pubsub_worker._delivery.acks`),
    as they do against the real service, and leaves them to the client's
    dispatcher on a faster network, such as the emulator's on loopback. A
    worker process calls this first, so that the crash windows are tested
    on the path production takes.
    """
    acks.SLOW_AFTER_S = 0.0
