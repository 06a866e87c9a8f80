"""``exactly_once`` bare and configured: what each form returns, at run time and to a type
checker (``mypy --strict`` runs over this file: an ``assert_type`` that no longer holds
fails the type check, as the assertions below fail the run)."""

from collections.abc import Callable
from typing import Any

from typing_extensions import assert_type

from pubsub_worker import ExactlyOnce, Job, MemoryJobStore, exactly_once


def handle(message: Any, job: Job) -> None:
    """A job-style handler."""


def callback(message: Any) -> None:
    """An unchanged stock callback."""


def test_the_bare_form_wraps_the_handler_it_decorates() -> None:
    wrapped = assert_type(exactly_once(handle), ExactlyOnce)

    assert isinstance(wrapped, ExactlyOnce)
    assert wrapped.__wrapped__ is handle
    assert (wrapped.__name__, wrapped.__doc__) == ("handle", "A job-style handler.")


def test_the_configured_form_is_a_decorator_that_makes_the_wrapper() -> None:
    store = MemoryJobStore()
    decorator = assert_type(exactly_once(store=store), Callable[[Callable[..., Any]], ExactlyOnce])
    wrapped = assert_type(decorator(callback), ExactlyOnce)

    assert isinstance(wrapped, ExactlyOnce)
    assert wrapped.__wrapped__ is callback
    assert wrapped.__name__ == "callback"


def test_a_handler_and_options_together_make_the_wrapper_at_once() -> None:
    wrapped = assert_type(exactly_once(handle, store=MemoryJobStore()), ExactlyOnce)

    assert isinstance(wrapped, ExactlyOnce)
    assert wrapped.__wrapped__ is handle
