"""Updates whose caller does not wait: the optional ``update_then`` of a job store.

A store that sends its writes from threads of its own (the batching Firestore
store, :mod:`pubsub_worker.stores.batching`) can hand a caller the outcome of
an update instead of keeping a thread blocked on it: the worker concludes a
finished job that way, on the thread that settles its completion's write
(``docs/architecture.md``, "Conclusions"). A store without the method is
written to with ``update``, and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .base import Changes, JobStore, Version

__all__ = ["ContinuedStore", "Settle", "Then", "continues"]

Settle = Callable[[], Version]
"""Settles an update that failed or whose outcome is unknown, as ``update`` would have:
the new version, or ``update``'s error. It may read and write the store: call it on a
thread that may wait."""

Then = Callable[[Version | None, Settle | None], None]
"""``then(version, None)`` once an update applied; ``then(None, settle)`` when it did not
or its outcome is unknown."""


@runtime_checkable
class ContinuedStore(JobStore, Protocol):
    """A store that can tell a caller the outcome of an update instead of making it wait."""

    def update_then(self, doc_id: str, changes: Changes, *, expected: Version, then: Then) -> None:
        """Send ``update(doc_id, changes, expected=expected)``; call ``then`` with its outcome.

        ``then`` is called once, on this thread or on the thread that sends
        the write; it must not block (it may hand work to another thread,
        ``settle`` among it). Raises :class:`~pubsub_worker.errors.StoreError`
        at once when the store is closed.
        """
        ...


_KNOWN: dict[type, bool] = {}
"""Whether a store's type is a :class:`ContinuedStore`, once asked (a protocol check is slow)."""


def continues(store: JobStore) -> bool:
    """Whether ``store`` is a :class:`ContinuedStore` (asked once per type)."""
    kind = type(store)
    known = _KNOWN.get(kind)
    if known is None:
        known = _KNOWN[kind] = isinstance(store, ContinuedStore)
    return known
