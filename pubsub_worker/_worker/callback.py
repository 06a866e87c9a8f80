"""The adapter for an existing ``callback(message)``: its ack and nack become outcomes.

The callback sees a proxy of the message, with the stock client's contract:

* ``ack()`` means "the work is done": the completion is committed, then the
  message acked. ``nack()`` means "the attempt failed": the job is released
  (the attempt counted), then the message nacked. Both go through the same
  ``conclude`` seam as the job-style path (:mod:`pubsub_worker._worker.outcome`), so
  shutdown, the processing cap and lost ownership end a callback exactly as
  they end a ``handler(message, job)``. The first of them decides; the job
  refuses ``message.job.*`` calls after it.
* They may be called from any thread, also after the callback returned (the
  message handed to the user's own pool). A callback that returns without
  either leaves the delivery *held*: its key, its Pub/Sub lease and its
  Firestore lease are kept, as the stock client keeps a message's, until
  ``ack()`` or ``nack()`` comes, or the processing cap passes (then it is a
  failed attempt).
* ``ack_with_response()`` and ``nack_with_response()`` return futures that
  tell the truth: ``SUCCESS`` only once the completion (or the release) is
  durable and Pub/Sub answered; otherwise the stock client's
  ``AcknowledgeError`` with its codes (``INVALID_ACK_ID`` for a delivery that
  lost the job, ``OTHER`` for one deferred or released instead).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from pubsub_worker._job.core import JobCore
from pubsub_worker._job.outbox import Outgoing

from .outcome import Decision, Happened, Outcome, Phase, Settled

__all__ = ["CallbackNacked", "Concluding", "DeferredMessageProxy", "MessageProxy"]

AckFuture = concurrent.futures.Future[AcknowledgeStatus]

_FINE_ACK = (Outcome.COMPLETE, Outcome.ACK)
_FINE_NACK = (Outcome.RETRY, Outcome.RELEASE, Outcome.NACK, Outcome.REVIEW)
_LOST = (Outcome.NACK, Outcome.DROP)


class CallbackNacked(Exception):
    """The callback called ``message.nack()``: a failed attempt."""


class Concluding(Protocol):
    """What the adapter needs of a delivery (:class:`~pubsub_worker._worker.flow.DeliveryFlow`)."""

    @property
    def settled(self) -> concurrent.futures.Future[Settled]:
        """Resolves once the delivery is settled on Pub/Sub (an ack: once answered)."""
        ...

    def conclude(self, happened: Happened) -> Decision:
        """Decide and carry out the outcome; the first call wins. Any thread."""
        ...

    def detach(self, *, counted: bool = False) -> bool:
        """Whoever concludes will end the delivery, not the callback's thread (False: decided)."""
        ...

    def hold(self) -> bool:
        """Keep the delivery (key and leases) until it is concluded; False if decided already."""
        ...


class MessageProxy:
    """The message an existing ``callback(message)`` sees: ack/nack go through the job."""

    def __init__(
        self,
        message: Any,
        job: JobCore,
        flow: Concluding,
        log: logging.LoggerAdapter[logging.Logger],
        *,
        face: Any = None,
    ) -> None:
        self._message = message
        self._job = job
        self._flow = flow
        self._log = log
        self._lock = threading.Lock()  # guards _asked
        self._asked: Happened | None = None
        self.job = job if face is None else face
        """The job, for callbacks that want steps (``message.job.step(...)``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    def __repr__(self) -> str:
        return f"<exactly-once {self._message!r}>"

    def ack(self) -> None:
        """Record the completion, then ack; from any thread. The first ack or nack decides."""
        self._ask(Happened(Phase.RUN))

    def nack(self) -> None:
        """Release the job for a retry (counts an attempt), then nack."""
        self._ask(Happened(Phase.RUN, error=CallbackNacked("nacked")))

    def ack_with_response(self) -> AckFuture:
        """:meth:`ack`; the future is ``SUCCESS`` once the completion is durable and acked.

        Otherwise it raises ``AcknowledgeError``: ``INVALID_ACK_ID`` when this
        delivery lost the job (another owner, a newer delivery, a refused ack id),
        the ack's own error when Pub/Sub refused it, ``OTHER`` when the completion
        could not be written now (the message comes back and finds what was done).
        """
        settled = self._flow.settled  # asked before the ack: an awaited ack is sent at once
        self.ack()
        return _answer(settled, _FINE_ACK, "acked")

    def nack_with_response(self) -> AckFuture:
        """:meth:`nack`; ``SUCCESS`` once the release is durable and the message nacked.

        A nack at ``MAX_ATTEMPTS`` sends the job to review: that is its success too.
        """
        self.nack()
        return _answer(self._flow.settled, _FINE_NACK, "nacked")

    def modify_ack_deadline(self, seconds: int) -> None:
        """Progress (a heartbeat) while undecided, then passed through; 0 is a nack."""
        if seconds == 0:
            self.nack()
            return
        if self._asked is None:
            self._job.heartbeat()
        self._message.modify_ack_deadline(seconds)

    def modify_ack_deadline_with_response(self, seconds: int) -> AckFuture:
        """As :meth:`modify_ack_deadline`; 0 is :meth:`nack_with_response`."""
        if seconds == 0:
            return self.nack_with_response()
        if self._asked is None:
            self._job.heartbeat()
        future: AckFuture = self._message.modify_ack_deadline_with_response(seconds)
        return future

    def finish(self, raised: BaseException | None) -> None:
        """The callback returned (or raised): a raise decides; a return without either holds."""
        if raised is not None:
            if self._asked is not None:
                self._log.warning("callback raised after it acked or nacked; ignored: %s", raised)
                return
            self._ask(Happened(Phase.RUN, error=raised))
            return
        if self._asked is not None:
            self._flow.detach()  # its own thread concludes it, maybe still: it ends it too
        elif self._flow.hold():
            self._log.debug("callback returned without ack() or nack(); the message is held")

    def _ask(self, happened: Happened) -> None:
        with self._lock:
            if self._asked is not None:
                return
            self._asked = happened
        self._conclude(happened)

    def _conclude(self, happened: Happened) -> None:
        self._job.handler_returned()
        self._flow.conclude(happened)


class DeferredMessageProxy(MessageProxy):
    """The proxy an ``async def callback(message)`` sees.

    ``ack()`` and ``nack()`` called on the event loop, where no write may block,
    conclude on a thread of ``io``: the loop is free at once, so ``await
    asyncio.wrap_future(message.ack_with_response())`` works. Messages given
    to ``message.job.publish()`` outside any step are committed (each a step
    of its own) and published before the completion.
    """

    def __init__(
        self,
        message: Any,
        job: JobCore,
        flow: Concluding,
        log: logging.LoggerAdapter[logging.Logger],
        *,
        face: Any,
        queued: Callable[[], list[Outgoing]],
        io: concurrent.futures.Executor,
    ) -> None:
        super().__init__(message, job, flow, log, face=face)
        self._queued = queued
        self._io = io

    def modify_ack_deadline(self, seconds: int) -> None:
        """Passes through (0 is a nack); a heartbeat is ``await message.job.heartbeat()``."""
        if seconds == 0:
            self.nack()
            return
        self._message.modify_ack_deadline(seconds)

    def _conclude(self, happened: Happened) -> None:
        # Taken now: the callback's later publishes are refused (the job is decided).
        queued = self._queued() if happened.error is None else []
        self._job.handler_returned()
        if not _on_loop():
            self._commit_and_conclude(happened, queued)
        elif self._flow.detach(counted=True):
            self._io.submit(self._commit_and_conclude, happened, queued)

    def _commit_and_conclude(self, happened: Happened, queued: list[Outgoing]) -> None:
        try:
            self._job.commit_publishes(queued)
        except Exception as exc:  # noqa: BLE001 - a publish not committed: a failed attempt
            happened = Happened(Phase.RUN, error=exc)
        self._flow.conclude(happened)


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _answer(
    settled: concurrent.futures.Future[Settled], fine: tuple[Outcome, ...], asked: str
) -> AckFuture:
    """The stock client's answer to an ack or nack, from how the delivery was settled."""
    answer: AckFuture = concurrent.futures.Future()

    def done(future: concurrent.futures.Future[Settled]) -> None:
        result = future.result()
        outcome, why = result.decision.outcome, result.decision.why
        if outcome not in fine:
            status = (
                AcknowledgeStatus.INVALID_ACK_ID if outcome in _LOST else AcknowledgeStatus.OTHER
            )
            text = f"{asked}, but the delivery's outcome is {outcome.value}: {why}"
            answer.set_exception(AcknowledgeError(status, text))
        elif result.answer is None or result.answer == "SUCCESS":
            answer.set_result(AcknowledgeStatus.SUCCESS)
        else:
            status = AcknowledgeStatus.__members__.get(result.answer, AcknowledgeStatus.OTHER)
            answer.set_exception(AcknowledgeError(status, f"Pub/Sub answered {result.answer}"))

    settled.add_done_callback(done)
    return answer
