"""The adapter for an existing ``callback(message)``: its ack and nack become outcomes.

The callback sees a proxy of the message. ``ack()`` means "the handler
returned" (the completion is committed, then the message acked), ``nack()``
means "the attempt failed"; both go through the same ``conclude`` seam as
the job-style path (:mod:`pubsub_worker.outcome`), so shutdown, the
processing cap and lost ownership end a legacy callback exactly as they end
a ``handler(message, job)``.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeStatus

from .job import Job
from .outcome import Decision, Happened, Phase

__all__ = ["CallbackNacked", "DeferredMessageProxy", "MessageProxy"]

Conclude = Callable[[Happened], Decision]
"""Decide and carry out the delivery's outcome from what happened; once per delivery."""


class CallbackNacked(Exception):
    """The callback called ``message.nack()``: a failed attempt."""


class MessageProxy:
    """The message an existing ``callback(message)`` sees: ack/nack go through the job."""

    def __init__(
        self,
        message: Any,
        job: Job,
        conclude: Conclude,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self._message = message
        self._conclude = conclude
        self._log = log
        self.job = job
        """The job, for callbacks that want steps (``message.job.step(...)``)."""
        self.decision: Decision | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    def __repr__(self) -> str:
        return f"<exactly-once {self._message!r}>"

    def ack(self) -> None:
        """Record the completion, then ack (once)."""
        if self.decision is None:
            self.decision = self._conclude(Happened(Phase.RUN))

    def ack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """Like :meth:`ack`; the future resolves when the ack was attempted."""
        self.ack()
        return _resolved(AcknowledgeStatus.SUCCESS)

    def nack(self) -> None:
        """Release the job for a retry (counts an attempt), then nack."""
        if self.decision is None:
            self.decision = self._conclude(Happened(Phase.RUN, error=CallbackNacked("nacked")))

    def nack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """Like :meth:`nack`."""
        self.nack()
        return _resolved(AcknowledgeStatus.SUCCESS)

    def modify_ack_deadline(self, seconds: int) -> None:
        """Counts as progress (a heartbeat) and passes through."""
        self.job.heartbeat()
        self._message.modify_ack_deadline(seconds)

    def finish(self, raised: BaseException | None) -> None:
        """After the callback ended: one that neither acked nor nacked is a failed attempt."""
        if self.decision is not None:
            if raised is not None:
                self._log.warning(
                    "callback raised after message.%s(); ignored: %s",
                    "ack" if self.decision.outcome.value == "complete" else "nack",
                    raised,
                )
            return
        if raised is None:
            self._log.warning("callback returned without ack() or nack(); treated as nack")
            raised = CallbackNacked("returned without ack() or nack()")
        self.decision = self._conclude(Happened(Phase.RUN, error=raised))


def _resolved(status: AcknowledgeStatus) -> concurrent.futures.Future[AcknowledgeStatus]:
    future: concurrent.futures.Future[AcknowledgeStatus] = concurrent.futures.Future()
    future.set_result(status)
    return future


class DeferredMessageProxy(MessageProxy):
    """The proxy an ``async def callback(message)`` sees: ack and nack take effect after it.

    ``ack()`` and ``nack()`` are called on the event loop, where the
    completion's writes must not run; they record what the callback asked,
    and :meth:`finish` concludes it once the coroutine is done, on the
    callback's thread.
    """

    def __init__(
        self,
        message: Any,
        job: Any,
        conclude: Conclude,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        super().__init__(message, job, conclude, log)
        self._asked: Happened | None = None

    def ack(self) -> None:
        """Complete, then ack, once the callback returns."""
        if self._asked is None:
            self._asked = Happened(Phase.RUN)

    def nack(self) -> None:
        """Release the job for a retry once the callback returns."""
        if self._asked is None:
            self._asked = Happened(Phase.RUN, error=CallbackNacked("nacked"))

    def modify_ack_deadline(self, seconds: int) -> None:
        """Passes through; a heartbeat is ``await message.job.heartbeat()`` here."""
        self._message.modify_ack_deadline(seconds)

    def finish(self, raised: BaseException | None) -> None:
        """After the coroutine ended: conclude what it asked for, or a failed attempt."""
        if self._asked is not None:
            if raised is not None:
                self._log.warning("callback raised after it acked or nacked; ignored: %s", raised)
            self.decision = self._conclude(self._asked)
            return
        super().finish(raised)
