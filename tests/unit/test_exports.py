"""The public surface is pinned: a change to it is a deliberate change to this list."""

import pubsub_worker


def test_all_is_sorted_and_pinned() -> None:
    assert pubsub_worker.__all__ == sorted(pubsub_worker.__all__)
    assert pubsub_worker.__all__ == [
        "BatchingFirestoreJobStore",
        "ConfigError",
        "Counter",
        "ExactlyOnce",
        "FirestoreJobStore",
        "InvalidMessage",
        "Job",
        "JobStore",
        "LostOwnership",
        "MemoryJobStore",
        "Metrics",
        "PermanentError",
        "ProcessingTimeout",
        "PubSubWorkerError",
        "Settings",
        "ShuttingDown",
        "Status",
        "StoreError",
        "Unreachable",
        "exactly_once",
        "flow_control",
        "run",
    ]


def test_every_export_exists_and_errors_share_one_base() -> None:
    for name in pubsub_worker.__all__:
        assert getattr(pubsub_worker, name) is not None
    for name in ("ConfigError", "LostOwnership", "PermanentError", "StoreError", "Unreachable"):
        assert issubclass(getattr(pubsub_worker, name), pubsub_worker.PubSubWorkerError)
    assert issubclass(pubsub_worker.ProcessingTimeout, pubsub_worker.LostOwnership)
    assert issubclass(pubsub_worker.ShuttingDown, pubsub_worker.LostOwnership)
