"""Transactional steps of ``async def`` handlers, through Firestore's async client.

The job's document and the business writes of ``fn(transaction)`` commit in
one ``AsyncTransaction``, with the same rules as
:meth:`~pubsub_worker.stores.firestore.FirestoreJobStore.transact`: the job's
version must be the one expected (else
:class:`~pubsub_worker.errors.VersionConflict`), ``fn`` may run again on
contention, and the commit carries a ``write_id`` so a commit whose reply was
lost is recognised by reading the document back. The store makes its async
client once, on the worker's event loop, as a twin of its sync client
(:func:`async_twin`): the same project, database, credentials, client options
and emulator host, so the transaction reads and writes the very documents the
store does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from pubsub_worker._support import fences
from pubsub_worker.errors import StoreError, VersionConflict

from ._write_ids import new_write_id
from .base import WRITE_ID, Changes, Version

__all__ = ["async_twin", "transact_async"]

_MAX_ATTEMPTS = 5


def async_twin(client: firestore.Client) -> firestore.AsyncClient:
    """An async client talking to the same Firestore database as ``client``.

    The project, database (a named one too, not only ``(default)``),
    credentials, client info and options are ``client``'s, and so is the
    emulator host it read from ``FIRESTORE_EMULATOR_HOST`` when it was made.
    """
    # The client library keeps these private; its own AsyncClient._to_sync_copy reads the same.
    twin = firestore.AsyncClient(
        project=client.project,
        credentials=client._credentials,
        database=client._database,
        client_info=client._client_info,
        client_options=client._client_options,
    )
    twin._emulator_host = client._emulator_host
    return twin


async def transact_async(
    client: firestore.AsyncClient,
    collection: str,
    doc_id: str,
    *,
    expected: Version,
    body: Callable[[Any], Awaitable[Any]],
    changes: Callable[[Any], Changes],
) -> tuple[Any, Version | None]:
    """Run ``await body(transaction)``, then write ``changes(result)`` to the job in
    ``collection``; all or nothing.

    Returns the body's result and the job's new version (``None`` if it
    could not be read back).
    """
    ref = client.collection(collection).document(doc_id)
    write_id = new_write_id()

    @firestore.async_transactional
    async def run(transaction: Any) -> Any:
        snap = await ref.get(transaction=transaction)
        # The ``transaction`` fence: the job is at the version its owner last wrote.
        if not snap.exists or (snap.update_time != expected and "transaction" not in fences.OFF):
            raise VersionConflict(doc_id)
        result = await body(transaction)
        data = {FieldPath(*path).to_api_repr(): value for path, value in changes(result).items()}
        data[WRITE_ID] = write_id
        transaction.update(ref, data)
        return result

    try:
        result = await run(client.transaction(max_attempts=_MAX_ATTEMPTS))
    except ValueError as exc:
        if isinstance(exc.__cause__, gexc.Aborted):
            raise StoreError(f"the transaction kept conflicting: {exc}") from exc
        raise
    except gexc.GoogleAPICallError as exc:
        snap = await ref.get()
        if snap.exists and (snap.to_dict() or {}).get(WRITE_ID) == write_id:
            raise StoreError(
                "the transactional step committed but its result could not be returned; "
                "the next delivery will read it"
            ) from exc
        raise StoreError(f"Firestore transaction failed: {exc}") from exc
    snap = await ref.get()
    if not snap.exists or (snap.to_dict() or {}).get(WRITE_ID) != write_id:
        return result, None
    return result, snap.update_time
