"""Transactions: other documents changing together with a job's, all or nothing.

A :class:`TransactionalStore` runs ``job.transactional_step``: the step's own writes
(``body(transaction)``) and the job's record commit in one transaction, checked
against the owner's version (the ``transaction`` fence,
:mod:`pubsub_worker._support.fences`). An :class:`AsyncTransactionalStore` also runs
the ``await job.transactional_step`` of an ``async def`` handler, its body awaited on
the worker's event loop. Both Firestore stores and the in-memory store are both; a
store of one's own may be either, or neither: a transactional step it cannot run raises
:class:`~pubsub_worker.errors.PermanentError`, and its job goes to review at once (no
attempt would do better), to be replayed once the worker's store can.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from .base import Changes, JobStore, Version

__all__ = ["AsyncTransactionalStore", "TransactionalStore"]


@runtime_checkable
class TransactionalStore(JobStore, Protocol):
    """A store whose documents can change together with the job in one transaction."""

    def transact(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Any],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """Run ``body(transaction)``, then write ``changes(result)`` to the job; all or nothing.

        The transaction first checks that the job's version is ``expected``
        (else :class:`~pubsub_worker.errors.VersionConflict`). ``body`` may run more
        than once when the transaction is retried on contention. Returns the body's
        result and the job's new version (``None`` if it could not be read back).
        """
        ...


@runtime_checkable
class AsyncTransactionalStore(TransactionalStore, Protocol):
    """A transactional store that also awaits an ``async def`` body."""

    async def transact_async(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Awaitable[Any]],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """:meth:`~TransactionalStore.transact` with ``await body(transaction)``.

        Called on the worker's event loop: nothing here may block it for a
        round trip (Firestore's stores go through Firestore's async client).
        """
        ...
