"""The fenced sink against the real Firestore emulator."""

from __future__ import annotations

from typing import Any

import pytest

import pubsub_worker
from samples.fenced_sink import FencedSink, StaleEpoch

pytestmark = pytest.mark.emulator


def test_a_write_with_an_older_epoch_is_refused_and_changes_nothing(
    firestore_client: Any, firestore_collection: str
) -> None:
    sink = FencedSink(firestore_client, firestore_collection)
    sink.write("claim-7/thumbnail", {"by": "first owner"}, epoch=1)
    sink.write("claim-7/thumbnail", {"by": "new owner"}, epoch=2)

    with pytest.raises(StaleEpoch) as refused:
        sink.write("claim-7/thumbnail", {"by": "first owner, late"}, epoch=1)

    assert (refused.value.epoch, refused.value.seen) == (1, 2)
    stored = sink.read("claim-7/thumbnail")
    assert stored is not None
    assert (stored["epoch"], stored["value"]) == (2, {"by": "new owner"})
    # One document per resource, whatever the resource name holds.
    assert len(list(firestore_client.collection(firestore_collection).stream())) == 1


def test_the_same_epoch_may_write_again_and_resources_are_independent(
    firestore_client: Any, firestore_collection: str
) -> None:
    sink = FencedSink(firestore_client, firestore_collection)
    sink.write("a", {"n": 1}, epoch=3)
    sink.write("a", {"n": 2}, epoch=3)  # the same owner re-running its step
    sink.write("b", {"n": 1}, epoch=1)  # another resource has its own epoch

    assert sink.read("a") is not None
    assert sink.read("a")["value"] == {"n": 2}  # type: ignore[index]
    assert sink.read("b")["epoch"] == 1  # type: ignore[index]
    assert sink.read("c") is None


def test_a_refusal_is_a_lost_ownership_for_the_wrapper() -> None:
    # Raised from a step, it stops the job without an ack, like any lost ownership.
    assert issubclass(StaleEpoch, pubsub_worker.LostOwnership)
