"""The sample's handler: ``pubsub-worker run samples.cloud_run.handler:handle``.

An order message (JSON ``{"order_id", "amount_cents"}``, effect key in the
``order_id`` attribute) is charged once and its receipt published once:

1. ``charge``: a call to a payment API with the step's idempotency key
   (simulated here: it sleeps ``ORDER_CHARGE_SECONDS``, reporting progress,
   so a stop or a scale-in lands mid-step);
2. ``receipt``: the receipt goes to ``RECEIPTS_TOPIC`` through the job's
   outbox, committed with the step and published after it.

A malformed order can never succeed: ``PermanentError``, the failure path.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pubsub_worker

__all__ = ["handle"]

_LOGGER = logging.getLogger(__name__)


def handle(message: Any, job: pubsub_worker.Job) -> None:
    """Charge the order once, then publish its receipt once."""
    try:
        order = json.loads(message.data)
        order_id, amount = str(order["order_id"]), int(order["amount_cents"])
    except (ValueError, KeyError, TypeError) as exc:
        raise pubsub_worker.PermanentError(f"not an order: {exc}") from exc

    def charge() -> dict[str, Any]:
        # A real payment API gets job.idempotency_key("charge") and charges once for it.
        deadline = time.monotonic() + float(os.environ.get("ORDER_CHARGE_SECONDS", "0"))
        while time.monotonic() < deadline:
            time.sleep(0.2)
            job.heartbeat()  # progress: the leases are renewed while this runs
        _LOGGER.info("charged order %s: %d cents", order_id, amount)
        return {"charge_id": job.idempotency_key("charge"), "amount_cents": amount}

    charged = job.step("charge", charge)

    def receipt() -> str:
        topic = os.environ.get("RECEIPTS_TOPIC")
        if topic:
            job.publish(topic, json.dumps({"order_id": order_id, **charged}).encode())
        return "sent" if topic else "no receipts topic"

    job.step("receipt", receipt)
