"""The Firestore emulator through the fixtures: transactions and reset."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import firestore

from emulator import Emulators

pytestmark = pytest.mark.emulator


def test_transaction_commits(firestore_client: Any, firestore_collection: str) -> None:
    ref = firestore_client.collection(firestore_collection).document("job-1")
    ref.set({"state": "new", "attempts": 0})

    @firestore.transactional
    def claim(transaction: Any) -> int:
        snapshot = ref.get(transaction=transaction)
        attempts = int(snapshot.get("attempts")) + 1
        transaction.update(ref, {"state": "claimed", "attempts": attempts})
        return attempts

    assert claim(firestore_client.transaction()) == 1
    assert ref.get().to_dict() == {"state": "claimed", "attempts": 1}


def test_reset_empties_the_project(
    emulators: Emulators, firestore_client: Any, firestore_collection: str
) -> None:
    collection = firestore_client.collection(firestore_collection)
    for n in range(3):
        collection.document(f"d{n}").set({"n": n})
    assert len(list(collection.stream())) == 3
    emulators.reset_firestore()
    assert list(collection.stream()) == []
    assert list(firestore_client.collections()) == []


def test_clean_firestore_fixture_starts_empty(
    clean_firestore: Emulators, firestore_client: Any
) -> None:
    assert list(firestore_client.collections()) == []
