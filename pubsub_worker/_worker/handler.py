"""The handler: what kind was given, checked when it is wrapped, and how it is called.

A handler is ``handler(message, job)`` (job-style: steps through ``job``;
returning means done) or an existing ``callback(message)`` (callback-style:
its ``message.ack()``/``nack()`` decide), either sync or ``async def``.
:func:`check_handler` refuses anything else with
:class:`~pubsub_worker.errors.InvalidHandler` before a message is taken,
never per message. :func:`unwrap` takes the handler out of an already
wrapped one (``@exactly_once``), so that the pull worker and the push
endpoint accept exactly the same handlers. :class:`HandlerCall` runs it for
a claimed job and concludes the delivery.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from google.cloud.pubsub_v1.subscriber.message import Message

from pubsub_worker._job.async_job import AsyncJob, EventLoopThread, flush_queued
from pubsub_worker._job.core import JobCore
from pubsub_worker._job.job import Job
from pubsub_worker.errors import InvalidHandler, ShuttingDown

from .callback import DeferredMessageProxy, MessageProxy
from .flow import DeliveryFlow
from .outcome import Happened, Phase

__all__ = ["HandlerCall", "Wrapped", "check_handler", "is_async", "sync", "takes_job", "unwrap"]

_FORMS = "handler(message, job) or callback(message), sync or async def"


class Wrapped(Protocol):
    """A handler wrapped already (:class:`~pubsub_worker.ExactlyOnce`)."""

    @property
    def handler(self) -> Callable[..., Any]:
        """The handler it wraps."""
        ...


def unwrap(handler: Any) -> Any:
    """The handler inside an already wrapped one (``@exactly_once``); else ``handler``."""
    seen = 0
    while getattr(handler, "__pubsub_worker_wrapped__", False):
        handler = handler.handler
        seen += 1
        if seen > 8:
            raise InvalidHandler("the handler is wrapped in itself")
    return handler


def check_handler(handler: Any) -> None:
    """Refuse what cannot be run as a handler, naming what is wrong (:class:`InvalidHandler`)."""
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    if not callable(handler):
        raise InvalidHandler(f"a handler must be callable ({_FORMS}); got {name!r}")
    if inspect.isclass(handler):
        raise InvalidHandler(
            f"{name} is a class: calling it would only build an instance; pass a function or an "
            f"instance with __call__ ({_FORMS})"
        )
    target = getattr(handler, "__call__", handler)  # noqa: B004 - an object with __call__
    if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
        raise InvalidHandler(f"{name} is a generator function: it would do nothing ({_FORMS})")
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise InvalidHandler(f"{name} is a generator: it would do nothing ({_FORMS})")
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin without a signature: taken as callback(message)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keyword_only:
        raise InvalidHandler(
            f"{name} needs keyword argument(s) {', '.join(keyword_only)} that no delivery "
            f"gives ({_FORMS})"
        )
    if not positional and not varargs:
        raise InvalidHandler(f"{name} takes no argument; it must take the message ({_FORMS})")
    if len(required) > 2:
        raise InvalidHandler(
            f"{name} needs {len(required)} arguments; a delivery gives the message and the "
            f"job ({_FORMS})"
        )


def is_async(handler: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def sync(result: Any) -> None:
    """A handler that returned an awaitable did nothing yet: never record it as completed."""
    if result is not None and inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError(
            "the handler returned an awaitable but is not an async def: pubsub-worker tells "
            "the two apart when it wraps the handler; declare it with async def"
        )


def takes_job(handler: Any) -> bool:
    """Job-style: takes ``(message, job)`` (two positional parameters, or ``*args``)."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for param in params:
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


class HandlerCall:
    """Runs one checked handler for a claimed job; the event loop of ``async def`` ones."""

    def __init__(self, handler: Any) -> None:
        handler = unwrap(handler)
        check_handler(handler)
        self.handler = handler
        self._callback_style = not takes_job(handler)
        self._async = is_async(handler)
        self._plain = not self._async and not self._callback_style  # handler(message, job)
        self.loop = EventLoopThread()

    def __call__(self, message: Message, job: JobCore, flow: DeliveryFlow) -> None:
        """Run the handler and conclude the delivery.

        A job-style handler that returned is concluded on the completer
        (``flow.conclude_later``); a failure here. A callback-style handler
        concludes through its message's ``ack()``/``nack()``, here or from its
        own threads later (:mod:`pubsub_worker._worker.callback`).
        """
        proxy, call = (None, None) if self._plain else self._prepare(message, job, flow, flow.log)
        try:
            if call is None:  # the common case, called here: no closure
                sync(self.handler(message, Job(job)))
            else:
                call()
        except Exception as exc:  # noqa: BLE001 - user code: its failure is an outcome
            error = _cancelled_is_shutdown(exc) if self._async else exc
            if proxy is not None:
                proxy.finish(error)
                return
            job.handler_returned()
            flow.conclude(Happened(Phase.RUN, error=error))
            return
        if proxy is not None:
            proxy.finish(None)
            return
        job.handler_returned()
        flow.conclude_later(Happened(Phase.RUN))

    def _prepare(
        self, message: Message, job: JobCore, flow: DeliveryFlow, log: logging.LoggerAdapter[Any]
    ) -> tuple[MessageProxy | None, Callable[[], None]]:
        """The call that runs any other handler, and the proxy concluding a callback-style one.

        An ``async def`` handler runs on the worker's loop while this thread waits.
        """
        if not self._async:  # a callback(message): a handler(message, job) is called directly
            proxy = MessageProxy(message, job, flow, log, face=Job(job))
            return proxy, lambda: sync(self.handler(proxy))
        ajob = AsyncJob(job, self.loop.io)
        if self._callback_style:
            deferred = DeferredMessageProxy(
                message, job, flow, log, face=ajob, queued=job.take_deferred, io=self.loop.io
            )
            return deferred, lambda: self.loop.run(_awaited(self.handler(deferred)))
        return None, lambda: self.loop.run(_job_done(self.handler(message, ajob), ajob))


def _cancelled_is_shutdown(error: Exception) -> Exception:
    """A handler's task cancelled (the worker's loop stopping) is a shutdown, not a failure."""
    if isinstance(error, concurrent.futures.CancelledError):
        return ShuttingDown("the worker stopped while the handler ran")
    return error


async def _awaited(result: Any) -> None:
    await result


async def _job_done(result: Any, job: AsyncJob) -> None:
    await result
    await flush_queued(job)  # publishes outside any step are steps: committed before completion
