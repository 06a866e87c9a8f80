"""End the streaming pulls the Pub/Sub emulator still serves for subscribers that are gone.

The Pub/Sub emulator (0.8.20) ends a streaming pull when its client
half-closes it, when its deadline passes (30 minutes after it was opened,
google-cloud-pubsub's default) or when its subscription stops being a pull
subscription; it ignores a cancel, and the disconnect of a process that
died. Until then that stream's loop takes messages from the subscription
every 50 ms, as a live one does, and each message it takes stays leased for
the stream's ack deadline before it is offered again. A subscriber started
after such a stop therefore waits an ack deadline (or several) for messages
a production subscription would hand it at once (docs/emulator.md,
"Stale streams").

:func:`end_streams` ends every stream of a subscription at once by making
it a push subscription for an instant: the streams of live subscribers end
too (with ``FAILED_PRECONDITION``, which the stock client does not retry),
so call it only while no subscriber consumes it. Leases, the backlog and
exactly-once delivery are kept. ``python -m emulator end-streams SUB...``
does the same from a shell.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.pubsub_v1 import SubscriberClient

__all__ = ["STALE_STREAM_REAPER", "end_streams"]

STALE_STREAM_REAPER = "http://127.0.0.1:9/stale-stream-reaper"
"""The push endpoint set for the instant (port 9, discard: nothing listens there)."""

_PUSH_LOOP_S = 0.2
"""How long the push configuration stays: each stream's loop checks its subscription every
50 ms and ends once it sees a push endpoint."""


def end_streams(subscriber: SubscriberClient, subscription_path: str) -> None:
    """End every streaming pull of a pull subscription at the emulator (see above).

    ``subscriber`` is a ``google.pubsub_v1.SubscriberClient`` on the emulator
    (``pubsub_v1.SubscriberClient`` of google-cloud-pubsub is one). The
    subscription is a pull subscription again when this returns.
    """
    push = {"push_endpoint": STALE_STREAM_REAPER}
    subscriber.modify_push_config(
        request={"subscription": subscription_path, "push_config": push}, timeout=10
    )
    time.sleep(_PUSH_LOOP_S)
    subscriber.modify_push_config(
        request={"subscription": subscription_path, "push_config": {}}, timeout=10
    )
