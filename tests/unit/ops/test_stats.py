"""The queries ``jobs stats`` sends to Firestore: each one a listing index serves, none a scan.

A recording stand-in for the client's query chain captures every filter,
order, projection and aggregation; real Firestore's answer to a query without
its index (``FailedPrecondition``) becomes the command that creates it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from pubsub_worker._ops.stats import FirestoreJobIndex, job_stats
from pubsub_worker.errors import StoreError
from pubsub_worker.stores import base as s
from pubsub_worker.stores import layout as jl
from pubsub_worker.stores.base import Status
from pubsub_worker.stores.layout import IndexMissing

SUB = "projects/proj/subscriptions/orders"
AT = datetime(2026, 3, 1, 11, 0, tzinfo=timezone.utc)


class Recorded:
    """A query chain that records what was asked and answers from ``answer``."""

    def __init__(self, log: list[Recorded], answer: Any) -> None:
        self.filters: list[tuple[str, str, Any]] = []
        self.orders: list[tuple[str, str]] = []
        self.selected: list[str] | None = None
        self.counted = False
        self.answer = answer
        log.append(self)

    def collection(self, _name: str) -> Recorded:
        return self

    def where(self, *, filter: Any) -> Recorded:
        self.filters.append((filter.field_path, filter.op_string, filter.value))
        return self

    def order_by(self, field: str, direction: str) -> Recorded:
        self.orders.append((field, direction))
        return self

    def limit(self, _n: int) -> Recorded:
        return self

    def select(self, fields: list[str]) -> Recorded:
        self.selected = fields
        return self

    def count(self, alias: str) -> Recorded:
        self.counted = True
        return self

    def get(self) -> Any:
        return self.answer(self)

    def stream(self) -> Any:
        return self.answer(self)


class Snap:
    def __init__(self, doc_id: str, fields: dict[str, Any]) -> None:
        self.id = doc_id
        self._fields = fields
        self.read_time = self.update_time = None

    def to_dict(self) -> dict[str, Any]:
        return self._fields


class Aggregate:
    def __init__(self, value: int) -> None:
        self.value = value


class Client:
    """Two running jobs (an hour apart), one failed; every query recorded."""

    def __init__(self, refuse: type[Exception] | None = None) -> None:
        self.log: list[Recorded] = []
        self.refuse = refuse

    def collection(self, _name: str) -> Recorded:
        return Recorded(self.log, self._answer)

    def _answer(self, query: Recorded) -> Any:
        if self.refuse is not None:
            raise self.refuse("The query requires an index. You can create it here: …")
        status = next(v for f, op, v in query.filters if f == s.STATUS)
        before = next((v for f, op, v in query.filters if f == s.UPDATED_AT), None)
        jobs = {
            "running": [("a", datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc))],
            "failed": [("f", AT)],
        }.get(status, [])
        if status == "running":
            jobs.append(("b", datetime(2026, 3, 1, 11, 0, tzinfo=timezone.utc)))
        matching = [(k, at) for k, at in jobs if before is None or at < before]
        if query.counted:
            return [[Aggregate(len(matching))]]
        matching.sort(key=lambda item: item[1], reverse=True)
        return [Snap(k, {s.KEY: k, s.STATUS: status, s.UPDATED_AT: at}) for k, at in matching]


def test_every_query_is_served_by_a_listing_index_and_none_filters_an_exempt_field() -> None:
    client = Client()
    stats = job_stats(FirestoreJobIndex(client, "jobs", SUB), now=AT)

    assert stats.oldest_running is not None
    assert stats.oldest_running.key == "a"
    assert stats.counts[Status.RUNNING] == 2
    for query in client.log:
        fields = [f for f, _op, _v in query.filters]
        assert fields[:3] == [s.SUBSCRIPTION, s.STATUS, s.SHARD]
        assert query.filters[2] == (s.SHARD, "in", list(range(s.SHARDS)))
        ranged = fields[3:] == [s.UPDATED_AT]
        assert fields[3:] in ([], [s.UPDATED_AT])
        assert [op for _f, op, _v in query.filters[3:]] in ([], ["<"])
        status = Status(query.filters[1][2])
        shape = jl.list_query_shape(status, older_than=ranged)
        assert shape.index() in jl.LIST_INDEXES
        if not query.counted:  # read newest first: the index's own order, never the reverse
            assert query.orders == [(s.UPDATED_AT, "DESCENDING"), ("__name__", "DESCENDING")]
        assert not {f for f, _op, _v in query.filters} & set(jl.EXEMPT_FIELDS) - {
            s.UPDATED_AT,
            s.SHARD,
        }
    reviews = [q for q in client.log if q.selected == [s.REVIEW]]
    assert len(reviews) == 1  # the pending reviews: the review field of failed jobs, read
    assert sum(q.counted for q in client.log) >= 4  # one per status, then the search


@pytest.mark.parametrize(
    ("refusal", "raised"),
    [(gexc.FailedPrecondition, IndexMissing), (gexc.ServiceUnavailable, StoreError)],
)
def test_a_refused_query_names_its_index_or_is_a_store_error(
    refusal: type[Exception], raised: type[Exception]
) -> None:
    with pytest.raises(raised) as caught:
        job_stats(FirestoreJobIndex(Client(refuse=refusal), "jobs", SUB), now=AT)
    if raised is IndexMissing:
        assert isinstance(caught.value, IndexMissing)
        assert caught.value.command == jl.index_commands("jobs")[1]
        assert "\n" not in str(caught.value)
