"""The Firestore job store.

Writes are preconditioned, never read-modify-write transactions: a claim of a
new job is a ``create`` (fails if the document exists) and every later write
is an ``update`` conditioned on the document's last update time, which our
own previous write returned. A write that fails with an unknown outcome
(deadline exceeded, connection cut, unavailable) is settled by reading the
document back: if it carries this write's ``write_id`` it landed; if the
version is unchanged it did not and is sent again; otherwise someone else
wrote and the caller gets :class:`~pubsub_worker.stores.base.VersionConflict`.

A read returns Firestore's own read time and update time with the fields,
so leases are judged on the server's clock, not this worker's.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from pubsub_worker._support import fences
from pubsub_worker.errors import StoreError

from ._write_ids import new_write_id
from .base import WRITE_ID, AlreadyExists, Changes, Snapshot, Version, VersionConflict
from .firestore_async import async_twin, transact_async

__all__ = ["FirestoreJobStore"]

_jitter = random.Random()
"""Jitter of retries and ticks, apart from the application's own ``random`` state."""

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")

# Errors after which a write may or may not have been applied.
_UNKNOWN_OUTCOME: tuple[type[Exception], ...] = (
    gexc.DeadlineExceeded,
    gexc.ServiceUnavailable,
    gexc.InternalServerError,
    gexc.Unknown,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.RetryError,
)


class _Contended(Exception):
    """The client gave up committing a transaction (lock contention); retried with backoff."""


_RETRIED: tuple[type[Exception], ...] = (*_UNKNOWN_OUTCOME, _Contended)


class FirestoreJobStore:
    """Implements :class:`~pubsub_worker.stores.transactions.AsyncTransactionalStore` on a
    Firestore collection.

    ``rpc_timeout_s`` bounds each RPC (a cut connection must not hang a
    worker); ``retry_deadline_s`` bounds the retries of one operation, after
    which :class:`~pubsub_worker.errors.StoreError` is raised.
    """

    def __init__(
        self,
        client: firestore.Client,
        collection: str,
        *,
        rpc_timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
    ) -> None:
        self._client = client
        self._collection = client.collection(collection)
        self.collection = collection
        self._rpc_timeout_s = rpc_timeout_s
        self._retry_deadline_s = retry_deadline_s
        self._async_client: firestore.AsyncClient | None = None  # made by transact_async

    @property
    def client(self) -> firestore.Client:
        """The Firestore client (for transactional steps that write other documents)."""
        return self._client

    def ref(self, doc_id: str) -> Any:
        """The document reference of a job."""
        return self._collection.document(doc_id)

    # -- JobStore -----------------------------------------------------------------

    def get(self, doc_id: str) -> Snapshot | None:
        snap = self._retry(
            "get", lambda: self.ref(doc_id).get(retry=None, timeout=self._rpc_timeout_s)
        )
        if not snap.exists:
            return None
        return Snapshot(
            fields=snap.to_dict() or {},
            version=snap.update_time,
            read_time=snap.read_time,
            update_time=snap.update_time,
        )

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> Version:
        write_id = new_write_id()
        data = {**fields, WRITE_ID: write_id}
        ref = self.ref(doc_id)

        def send() -> Version:
            return ref.create(data, retry=None, timeout=self._rpc_timeout_s).update_time

        return self._settled_create(doc_id, write_id, send)

    def update(self, doc_id: str, changes: Changes, *, expected: Version) -> Version:
        write_id = new_write_id()
        data = {_path(path): value for path, value in changes.items()}
        data[WRITE_ID] = write_id
        ref = self.ref(doc_id)
        option = self._client.write_option(last_update_time=expected)

        def send() -> Version:
            return ref.update(
                data, option=option, retry=None, timeout=self._rpc_timeout_s
            ).update_time

        return self._settled_update(doc_id, write_id, expected, send)

    # -- settling unknown outcomes (shared with the batching store) ---------------

    def _landed(self, doc_id: str, write_id: str) -> Version | None:
        """The document's version if its last write is ``write_id``, else None."""
        snap = self.get(doc_id)
        if snap is not None and snap.fields.get(WRITE_ID) == write_id:
            return snap.version
        return None

    def _settled_create(self, doc_id: str, write_id: str, send: Callable[[], Version]) -> Version:
        """``send()`` a create-if-absent until its outcome is known; see the module docstring."""
        uncertain = False  # an earlier attempt's outcome was unknown: it may land late

        def attempt() -> Version:
            nonlocal uncertain
            try:
                return send()
            except (gexc.AlreadyExists, gexc.FailedPrecondition) as exc:
                if uncertain and (version := self._landed(doc_id, write_id)) is not None:
                    return version  # our own earlier attempt created it
                raise AlreadyExists(doc_id) from exc
            except _UNKNOWN_OUTCOME:
                uncertain = True
                snap = self.get(doc_id)
                if snap is None:
                    raise  # not applied: retried
                if snap.fields.get(WRITE_ID) == write_id:
                    return snap.version
                raise AlreadyExists(doc_id) from None

        return self._retry("create", attempt)

    def _settled_update(
        self, doc_id: str, write_id: str, expected: Version, send: Callable[[], Version]
    ) -> Version:
        """``send()`` a conditional update until its outcome is known; see the module docstring."""
        uncertain = False  # an earlier attempt's outcome was unknown: it may land late

        def attempt() -> Version:
            nonlocal uncertain
            try:
                return send()
            except (gexc.FailedPrecondition, gexc.NotFound) as exc:
                if uncertain and (version := self._landed(doc_id, write_id)) is not None:
                    return version  # our own earlier attempt changed the version
                raise VersionConflict(doc_id) from exc
            except _UNKNOWN_OUTCOME:
                uncertain = True
                snap = self.get(doc_id)
                if snap is not None and snap.fields.get(WRITE_ID) == write_id:
                    return snap.version
                if snap is None or snap.version != expected:
                    raise VersionConflict(doc_id) from None
                raise  # not applied and nobody else wrote: retried

        return self._retry("update", attempt)

    # -- transactions (stores/transactions.py) -------------------------------------

    def transact(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Any],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        ref = self.ref(doc_id)
        write_id = new_write_id()

        @firestore.transactional
        def run(transaction: Any) -> Any:
            snap = ref.get(transaction=transaction, timeout=self._rpc_timeout_s)
            # The ``transaction`` fence: the job is at the version its owner last wrote.
            if not snap.exists or (
                snap.update_time != expected and "transaction" not in fences.OFF
            ):
                raise VersionConflict(doc_id)
            result = body(transaction)
            data = {_path(path): value for path, value in changes(result).items()}
            data[WRITE_ID] = write_id
            transaction.update(ref, data)
            return result

        def attempt() -> Any:
            try:
                return run(self._client.transaction(max_attempts=5))
            except ValueError as exc:
                # "Failed to commit transaction in 5 attempts." comes from Aborted commits;
                # any other ValueError was raised by ``body`` and is the caller's.
                if isinstance(exc.__cause__, gexc.Aborted):
                    raise _Contended(str(exc)) from exc
                raise

        try:
            result = self._retry("transaction", attempt)
        except StoreError:
            # The commit may have landed before the error: settle by reading back.
            snap = self.get(doc_id)
            if snap is None or snap.fields.get(WRITE_ID) != write_id:
                raise
            raise StoreError(
                "the transactional step committed but its result could not be returned; "
                "the next delivery will read it"
            ) from None
        snap = self.get(doc_id)
        if snap is None or snap.fields.get(WRITE_ID) != write_id:
            return result, None
        return result, snap.version

    async def transact_async(
        self,
        doc_id: str,
        *,
        expected: Version,
        body: Callable[[Any], Awaitable[Any]],
        changes: Callable[[Any], Changes],
    ) -> tuple[Any, Version | None]:
        """:meth:`transact` with ``await body(transaction)``: an ``AsyncTransaction`` of a
        twin of this store's client in Firestore's async client, made on the first call (on
        the worker's event loop; :mod:`~pubsub_worker.stores.firestore_async`), so the loop
        never waits."""
        if self._async_client is None:
            self._async_client = async_twin(self._client)
        return await transact_async(
            self._async_client,
            self.collection,
            doc_id,
            expected=expected,
            body=body,
            changes=changes,
        )

    # -- plumbing -----------------------------------------------------------------

    def _retry(self, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` until it returns, retrying transient errors with jittered backoff."""
        deadline = time.monotonic() + self._retry_deadline_s
        delay = 0.05
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except _RETRIED as exc:
                if time.monotonic() + delay > deadline:
                    raise StoreError(f"Firestore {what} failed after {tries} tries: {exc}") from exc
                _LOGGER.info(
                    "Firestore %s failed (%s); retry %d in %.2f s", what, exc, tries, delay
                )
                time.sleep(delay * _jitter.uniform(0.5, 1.5))
                delay = min(delay * 2, 2.0)
            except gexc.GoogleAPICallError as exc:
                raise StoreError(f"Firestore {what} failed: {exc}") from exc


def _path(parts: tuple[str, ...]) -> str:
    return str(FieldPath(*parts).to_api_repr())
