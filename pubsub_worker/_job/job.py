"""The job a handler sees: steps, transactional steps, the outbox and heartbeats.

:class:`Job` is the handler's face over the job's
:class:`~pubsub_worker._job.core.JobCore`, which holds the step machinery,
the fences and the conclusion (complete, release, fail) that the worker uses
(imported from here too, by the worker that builds the face).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .core import JobCore
from .outbox import escape

__all__ = ["BaseJob", "Job", "JobCore"]

T = TypeVar("T")


class BaseJob:
    """What both faces of a job show: who it is (key, epoch, attempt, message id, steps)."""

    def __init__(self, core: JobCore) -> None:
        self._core = core

    @property
    def key(self) -> str:
        """The effect key: the key attribute's value, or the message id."""
        return self._core.key

    @property
    def epoch(self) -> int:
        """The fencing token: grows with every claim. Pass it to sinks that can check it."""
        return self._core.epoch

    @property
    def attempt(self) -> int:
        """Which claim of this job this is, from 1 (counted in the job document)."""
        return self._core.attempt

    @property
    def message_id(self) -> str:
        """The message id of this delivery."""
        return self._core.message_id

    @property
    def completed_steps(self) -> tuple[str, ...]:
        """Names of the steps recorded so far (by this or an earlier owner)."""
        return self._core.completed_steps

    def idempotency_key(self, step: str) -> str:
        """A key stable across redeliveries and owners: ``{key}:{step}``.

        ``%`` and ``:`` inside the key or step name are percent-encoded, so two
        different (key, step) pairs never share an idempotency key.

        Give it to a sink that deduplicates (payment APIs, object stores) so
        a step that re-runs after a crash repeats no effect there.
        """
        return f"{escape(self.key)}:{escape(step)}"


class Job(BaseJob):
    """One claimed job, handed to the callback as its second argument.

    Use it from the callback's thread. ``heartbeat()`` may also be called
    from another thread.
    """

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once for this job and return its result.

        If the step was recorded before (by this or an earlier owner), its
        result is returned and ``fn`` does not run. Otherwise ``fn`` runs
        outside any transaction and its result, which must be JSON, is
        committed with a check that this owner still holds the job; if not,
        :class:`~pubsub_worker.errors.LostOwnership` is raised and the result is
        discarded. The result returned is the JSON round trip of ``fn()``, the
        same value a redelivery gets. ``fn`` itself runs at least once: make its
        external effect idempotent with :meth:`idempotency_key`, or fence it
        with :attr:`epoch`.
        """
        return self._core.run_step(name, fn)

    def transactional_step(self, name: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(transaction)`` and record the step in the same Firestore transaction.

        ``fn`` receives the store's transaction (a ``google.cloud.firestore.Transaction``;
        on the in-memory store a :class:`~pubsub_worker.stores.memory.MemoryTransaction`
        with the same ``get``/``create``/``set``/``update``/``delete``); the business
        writes it makes through it, the step record and the ownership check
        commit together or not at all: a stale owner's write never lands, and
        the effect happens exactly once. ``fn`` runs *inside* the transaction:
        keep it short, read before you write, and do nothing outside the
        transaction, because it may be run again when the transaction is
        retried on contention (messages given to :meth:`publish` from it are
        queued once, from the attempt that commits). Of the job, call only
        :meth:`publish` from ``fn``. The transaction locks the job document
        while ``fn`` runs: a worker frozen inside ``fn`` blocks the next owner
        until Firestore expires its transaction (60 s idle on the emulator),
        and its commit then fails. Returns the recorded result like :meth:`step`.
        """
        return self._core.run_transactional(name, fn)

    def publish(self, topic: str, data: bytes, **attributes: str) -> None:
        """Publish a message exactly once for this job.

        Inside a step, the message is written to the job's outbox in the
        step's commit and published after it. Outside any step, the publish
        is a step of its own (named ``~publish.N`` by its order in the
        handler), committed and then published. Either way the message
        carries the effect key (``{key}:{step}:{n}``) in the attribute named by
        ``PUBSUB_WORKER_OUTBOX_KEY_ATTRIBUTE`` and the step name in
        ``pubsub_worker_step``. An entry that could not be published is
        published again, with the same effect key, before the job completes
        or by the next delivery, so a consumer keyed on that attribute drops
        any duplicate. Raises :class:`~pubsub_worker.errors.LimitExceeded` for
        a message Pub/Sub would refuse (checked now, not after the commit).
        """
        self._core.publish(topic, data, attributes)

    def heartbeat(self) -> None:
        """Report progress: the leases are renewed only while a job reports it.

        Call it from long steps. Raises :class:`~pubsub_worker.errors.LostOwnership`
        if this delivery no longer owns the job, so a stale step stops early.
        """
        self._core.heartbeat()
