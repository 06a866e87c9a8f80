"""The public surface is pinned: a change to it is a deliberate change to this list."""

import pubsub_worker


def test_all_is_sorted_and_pinned() -> None:
    assert pubsub_worker.__all__ == sorted(pubsub_worker.__all__)
    assert pubsub_worker.__all__ == [
        "AlreadyExists",
        "AsyncJob",
        "BatchingFirestoreJobStore",
        "ConfigError",
        "Counter",
        "DocumentTooLarge",
        "ExactlyOnce",
        "FailurePathUnavailable",
        "FirestoreJobStore",
        "Hooks",
        "InvalidMessage",
        "Job",
        "JobStore",
        "LimitExceeded",
        "LostOwnership",
        "MemoryJobStore",
        "Metrics",
        "OutboxUnsent",
        "Outcome",
        "PermanentError",
        "ProcessingTimeout",
        "PubSubWorkerError",
        "Settings",
        "ShuttingDown",
        "Status",
        "StoreError",
        "Unreachable",
        "VersionConflict",
        "exactly_once",
        "flow_control",
        "run",
    ]


def test_every_export_exists_and_errors_share_one_base() -> None:
    for name in pubsub_worker.__all__:
        assert getattr(pubsub_worker, name) is not None
    errors = [n for n in pubsub_worker.__all__ if n.endswith(("Error", "Exists", "Unavailable"))]
    errors += ["LostOwnership", "LimitExceeded", "DocumentTooLarge", "VersionConflict"]
    errors += ["OutboxUnsent", "Unreachable", "InvalidMessage", "ShuttingDown"]
    for name in errors:
        assert issubclass(getattr(pubsub_worker, name), pubsub_worker.PubSubWorkerError), name
    assert issubclass(pubsub_worker.LimitExceeded, pubsub_worker.PermanentError)
    assert issubclass(pubsub_worker.DocumentTooLarge, pubsub_worker.PermanentError)
    assert issubclass(pubsub_worker.ProcessingTimeout, pubsub_worker.LostOwnership)
    assert issubclass(pubsub_worker.ShuttingDown, pubsub_worker.LostOwnership)
