"""A subscriber written for the stock Pub/Sub client, made exactly-once by one added line.

The callback is ordinary code: it sends a welcome email for each sign-up,
then acks. Pub/Sub delivers at least once, and a retrying upstream may
publish the same sign-up twice, so without the marked line some people get
two emails. With it, a sign-up whose callback acked is never run again:
later copies (same ``signup_id`` attribute) are acked without calling it.
"""

from __future__ import annotations

import json
import os

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud.pubsub_v1.subscriber.message import Message

import pubsub_worker

sent: list[str] = []
"""Stands in for an email API: the addresses "sent" so far."""


def send_welcome_email(address: str) -> None:
    sent.append(address)


def callback(message: Message) -> None:
    signup = json.loads(message.data)
    send_welcome_email(signup["email"])
    message.ack()


callback = pubsub_worker.exactly_once(callback)  # the one added line


def main() -> None:
    """Consume ``PUBSUB_WORKER_SUBSCRIPTION`` until interrupted."""
    subscriber = pubsub_v1.SubscriberClient()
    future = subscriber.subscribe(os.environ["PUBSUB_WORKER_SUBSCRIPTION"], callback=callback)
    with subscriber:
        future.result()


if __name__ == "__main__":
    main()
