"""What kind of handler was wrapped: job-style or callback-style, sync or ``async def``."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["check_handler", "is_async", "sync", "takes_job"]


def check_handler(handler: Any) -> None:
    """Refuse what cannot be run, at wrap time."""
    if not callable(handler):
        raise TypeError(f"exactly_once() needs a callable, got {type(handler).__name__}")


def is_async(handler: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def sync(result: Any) -> None:
    """A handler that returned an awaitable did nothing yet: never record it as completed."""
    if inspect.isawaitable(result):
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
