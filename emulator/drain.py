"""Pull a subscription empty: every message that arrives until it stays quiet.

What tests and demos check at the end of a run ("which messages reached the
output topic, how many times each") is what :func:`drain_messages` returns:
it pulls and acks until no message has arrived for ``quiet_s`` seconds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.pubsub_v1 import SubscriberClient
    from google.pubsub_v1.types import PubsubMessage

__all__ = ["drain_messages"]

_PULL_TIMEOUT_S = 2.0
"""One pull's RPC deadline. The emulator holds an empty pull open until about
a second before its deadline, and answers as soon as a message arrives."""
_EMPTY_PAUSE_S = 0.1
"""Pause after an empty answer, so that a pull answered at once is not repeated in a busy loop."""


def drain_messages(
    subscriber: SubscriberClient,
    subscription: str,
    *,
    quiet_s: float = 1.5,
    timeout_s: float = 60.0,
    max_messages: int = 100,
) -> list[PubsubMessage]:
    """Pull and ack every message on ``subscription`` until none arrives for ``quiet_s``.

    Args:
        subscriber: A ``google.pubsub_v1.SubscriberClient`` (the
            ``pubsub_v1.SubscriberClient`` of ``google-cloud-pubsub``).
        subscription: The full path, ``projects/P/subscriptions/S``.
        quiet_s: Seconds without a new message after which the subscription
            counts as drained (the window restarts with every message).
        timeout_s: Seconds the whole drain may take (no pull outlasts it;
            the last ack may end a little after).
        max_messages: Messages asked for by one pull.

    Returns:
        Every message pulled, in the order pulled, redeliveries included
        (each copy counts): a count of the payloads is a count of what was
        delivered. Each pulled batch is acked before the next pull.

    Raises:
        ValueError: ``quiet_s`` is not positive, ``timeout_s`` is shorter
            than ``quiet_s``, or ``max_messages`` is below 1.
        TimeoutError: Messages were still arriving after ``timeout_s``
            seconds (those pulled so far are acked; the error says how many).
    """
    if quiet_s <= 0:
        raise ValueError(f"quiet_s must be positive, not {quiet_s!r}")
    if timeout_s < quiet_s:
        raise ValueError(f"timeout_s ({timeout_s!r}) must be at least quiet_s ({quiet_s!r})")
    if max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, not {max_messages!r}")
    # Imported here: the harness's other users (the pytest plugin, the CLI) never pull.
    from google.api_core.exceptions import DeadlineExceeded  # noqa: PLC0415

    received: list[PubsubMessage] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = time.monotonic() + quiet_s
    while (now := time.monotonic()) < quiet_until:
        if now >= deadline:
            raise TimeoutError(
                f"{subscription} was not quiet for {quiet_s} s within {timeout_s} s "
                f"({len(received)} messages pulled and acked)"
            )
        try:
            response = subscriber.pull(
                request={"subscription": subscription, "max_messages": max_messages},
                timeout=min(_PULL_TIMEOUT_S, deadline - now),
            )
        except DeadlineExceeded:
            continue
        if not response.received_messages:
            time.sleep(_EMPTY_PAUSE_S)
            continue
        received.extend(m.message for m in response.received_messages)
        subscriber.acknowledge(
            request={
                "subscription": subscription,
                "ack_ids": [m.ack_id for m in response.received_messages],
            }
        )
        quiet_until = time.monotonic() + quiet_s
    return received
