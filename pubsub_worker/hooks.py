"""Hooks: no-op points in the life of a delivery, for instrumentation and crash tests.

Subclass :class:`Hooks`, override what you need and pass an instance as
``exactly_once(handler, hooks=...)`` (or ``run(handler, hooks=...)``). Every
method is called on the thread that handles the delivery at that point: the
callback thread, or for a handler that returned, from its completion on,
the thread that settled the completion's write (the callback's own, or a
batch writer: the writes of several jobs share an RPC; never another
delivery's callback thread) or the completer's (``settled`` for an ack:
where its answer arrives). Each must return quickly: a hook that blocks
after a completion holds up the other deliveries whose writes shared its
RPC. An exception raised by a hook
propagates like one raised at that point of the library (which is how tests
inject failures). The default implementation does nothing.
"""

from __future__ import annotations

__all__ = ["Hooks"]


class Hooks:
    """Points in one delivery's life, in order. All no-ops by default."""

    def received(self, message_id: str) -> None:
        """A delivery was handed to the wrapper."""

    def after_commit(self, key: str, step: str) -> None:
        """A step's record (with its outbox entries) is durable."""

    def before_publish(self, key: str, step: str, entry_id: str) -> None:
        """An outbox entry is committed and about to be published."""

    def after_publish(self, key: str, step: str, entry_id: str) -> None:
        """An outbox entry was published; its ``sent`` mark is not yet committed."""

    def before_review(self, key: str | None, message_id: str) -> None:
        """A message goes to the failure path: a job's owner has just confirmed it holds the job
        (and published its unsent outbox entries); nothing is recorded or published for review
        yet."""

    def before_ack(self, key: str | None, message_id: str) -> None:
        """The job's record is final and durable; the ack is about to be sent."""

    def settled(self, message_id: str, outcome: str, answer: str | None) -> None:
        """The delivery's outcome was carried out on Pub/Sub.

        ``outcome`` is an :class:`~pubsub_worker._worker.outcome.Outcome` value;
        ``answer`` is the ack's answer (``SUCCESS``, ``INVALID_ACK_ID``,
        ``TIMEOUT`` ...) for outcomes that ack, else ``None``.
        """
