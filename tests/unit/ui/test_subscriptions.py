"""The subscriptions a dashboard shows: from names or paths, each once, in order."""

from __future__ import annotations

import pytest

from pubsub_worker import Settings
from pubsub_worker.ui.jobs import Jobs


def test_subscriptions_are_shown_once_each_in_the_order_given() -> None:
    settings = Settings(subscription="orders", project="proj", collection="jobs")
    jobs = Jobs(
        settings, ["orders", "projects/proj/subscriptions/orders", "refunds"], client=_Client()
    )
    assert [sub.path for sub in jobs.subscriptions] == [
        "projects/proj/subscriptions/orders",
        "projects/proj/subscriptions/refunds",
    ]
    assert jobs.subscription("refunds").index == 1
    assert jobs.subscription(None).name == "orders"
    with pytest.raises(KeyError):
        jobs.subscription("payments")
    jobs.close()


class _Client:
    """Enough of a Firestore client to build the store: nothing is read here."""

    def collection(self, name: str) -> object:
        return object()
