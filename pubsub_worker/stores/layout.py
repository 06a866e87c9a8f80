"""The Firestore set-up the job layout needs on real Firestore, as data and as commands.

:data:`LIST_INDEXES` (the composite indexes of ``jobs list``),
:data:`DASHBOARD_INDEXES` (those of ``pubsub-worker ui``), :data:`EXEMPT_FIELDS`
(the fields no query reads, exempt from single-field indexing), as
``firestore.indexes.json`` (:func:`indexes_json`) and as ``gcloud`` commands,
with the pure judgments of what the Admin API answers (:func:`has_index`,
:func:`still_indexed`), and :class:`IndexMissing`, what a query refused for
want of its index raises. Why each field is exempt, and what that buys, is
``docs/operations.md`` ("Capacity"); ``pubsub-worker config`` checks it
(:mod:`pubsub_worker._ops.config_check`). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pubsub_worker.errors import PubSubWorkerError
from pubsub_worker.stores import base as s
from pubsub_worker.stores.base import Status

__all__ = [
    "DASHBOARD_INDEXES",
    "EXEMPT_FIELDS",
    "LIST_INDEXES",
    "QUERIED_FIELDS",
    "IndexField",
    "IndexMissing",
    "QueryShape",
    "dashboard_index_hints",
    "exemption_command",
    "exemption_commands",
    "exemption_hints",
    "has_index",
    "index_command",
    "index_commands",
    "index_hints",
    "indexes_json",
    "list_query_shape",
    "still_indexed",
    "ttl_command",
]


# -- the Firestore set-up of the job layout ------------------------------------------


@dataclass(frozen=True)
class IndexField:
    """One field of a composite index."""

    path: str
    descending: bool = False


_NEWEST_FIRST = IndexField(s.UPDATED_AT, descending=True)

LIST_INDEXES: tuple[tuple[IndexField, ...], ...] = (
    (IndexField(s.SUBSCRIPTION), IndexField(s.SHARD), _NEWEST_FIRST),
    (IndexField(s.SUBSCRIPTION), IndexField(s.STATUS), IndexField(s.SHARD), _NEWEST_FIRST),
)
"""The composite indexes (collection scope) ``jobs list`` needs on real Firestore.

The shard comes before ``updated_at``: a subscription's writes then land at
the ends of :data:`~pubsub_worker.stores.base.SHARDS` index ranges, each
taking Firestore's 500 writes per second for sequential values, not at one."""

DASHBOARD_INDEXES: tuple[tuple[IndexField, ...], ...] = (
    (
        IndexField(s.SUBSCRIPTION),
        IndexField(s.STATUS),
        IndexField(s.REASON),
        IndexField(s.SHARD),
        _NEWEST_FIRST,
    ),
)
"""The composite index ``pubsub-worker ui`` adds: failed jobs by reason (its review queue;
only documents that ever failed carry ``reason``, so only they have entries). Everything
else it reads, ``jobs list`` and ``jobs stats`` read too, from :data:`LIST_INDEXES`."""

QUERIED_FIELDS: tuple[str, ...] = (s.SUBSCRIPTION, s.STATUS)
"""Fields whose single-field indexes a query needs: ``jobs replay --all-failed`` asks
for ``subscription == S and status == failed``, which Firestore serves by merging these
two. Neither value is sequential: no hotspot."""

_SEQUENTIAL = "sequential: the time of a write, so each new value lands at the end of its index"
_LARGE = "large, never queried: its index entries cost write latency and storage"
_UNQUERIED = "never queried"

EXEMPT_FIELDS: dict[str, str] = {
    s.KEY: "never queried (jobs show and replay read a key's document by its id); "
    "often sequential (message ids, order numbers)",
    s.EPOCH: _UNQUERIED,
    s.OWNER: _UNQUERIED,
    s.MESSAGE_ID: "never queried; sequential (Pub/Sub's message ids grow)",
    s.DELIVERY: _UNQUERIED,
    s.LEASE_SECONDS: _UNQUERIED,
    s.LEASE_EXPIRES_AT: _SEQUENTIAL,
    s.ATTEMPTS: _UNQUERIED,
    s.PAYLOAD_SHA256: _UNQUERIED,
    s.STEPS: _LARGE + " (a map: entries per subfield; the exemption covers them all)",
    s.OUTBOX: _LARGE + " (a map: entries per subfield; the exemption covers them all)",
    s.ERROR: _LARGE,
    s.REASON: _UNQUERIED,
    s.DATA: _LARGE,
    s.ATTRIBUTES: _LARGE,
    s.FIRST_SEEN_AT: _SEQUENTIAL,
    s.UPDATED_AT: _SEQUENTIAL + " (jobs list reads it through the composite indexes, "
    "which single-field settings do not touch)",
    s.COMPLETED_AT: _SEQUENTIAL,
    s.FAILED_AT: _SEQUENTIAL,
    s.REPLAYED_AT: _SEQUENTIAL,
    s.EXPIRE_AT: _SEQUENTIAL + " (the TTL policy needs no index)",
    s.TRACE_PARENT: _UNQUERIED,
    s.WRITE_ID: _UNQUERIED,
    s.SHARD: "only in the composite indexes",
    s.REVIEW: _UNQUERIED,
}
"""Every other field of the layout, exempt from single-field indexing, and why."""


@dataclass(frozen=True)
class QueryShape:
    """What a listing query filters and orders on: enough to name the index it needs."""

    equalities: tuple[str, ...]
    disjunction: str
    """The field of the ``in`` filter (the shard): an equality per value, for the index."""
    range_field: str | None
    order: IndexField

    def index(self) -> tuple[IndexField, ...]:
        """The composite index Firestore serves this query from (``__name__`` is implicit)."""
        return (
            *(IndexField(path) for path in self.equalities),
            IndexField(self.disjunction),
            self.order,
        )


def list_query_shape(
    status: Status | None, *, older_than: bool, reason: bool = False
) -> QueryShape:
    """The shape of :func:`~pubsub_worker._ops.listing.listing_query`'s query. Pure."""
    equalities = (s.SUBSCRIPTION,) if status is None else (s.SUBSCRIPTION, s.STATUS)
    return QueryShape(
        equalities=equalities + ((s.REASON,) if reason else ()),
        disjunction=s.SHARD,
        range_field=s.UPDATED_AT if older_than else None,
        order=_NEWEST_FIRST,
    )


def indexes_json(collection: str) -> dict[str, Any]:
    """:data:`LIST_INDEXES`, :data:`DASHBOARD_INDEXES` and :data:`EXEMPT_FIELDS` as
    ``firestore.indexes.json``.

    ``expire_at``'s override also turns the TTL policy on (``"ttl": true``).
    """
    return {
        "indexes": [
            {
                "collectionGroup": collection,
                "queryScope": "COLLECTION",
                "fields": [
                    {"fieldPath": f.path, "order": "DESCENDING" if f.descending else "ASCENDING"}
                    for f in index
                ],
            }
            for index in LIST_INDEXES + DASHBOARD_INDEXES
        ],
        "fieldOverrides": [
            {
                "collectionGroup": collection,
                "fieldPath": path,
                **({"ttl": True} if path == s.EXPIRE_AT else {}),
                "indexes": [],
            }
            for path in EXEMPT_FIELDS
        ],
    }


def index_command(collection: str, index: tuple[IndexField, ...]) -> str:
    """The ``gcloud firestore indexes composite create`` command of one composite index."""
    configs = " ".join(
        f"--field-config=field-path={f.path},order={'descending' if f.descending else 'ascending'}"
        for f in index
    )
    return f"gcloud firestore indexes composite create --collection-group={collection} {configs}"


class IndexMissing(PubSubWorkerError):
    """Firestore refused a query for want of its composite index (the message is one line)."""

    def __init__(self, command: str, detail: str) -> None:
        super().__init__(
            f"Firestore needs a composite index for this query; create it with: {command} "
            f"(all of them: docs/operations.md; Firestore said: {detail})"
        )
        self.command = command


def index_commands(collection: str) -> list[str]:
    """A ``gcloud`` command per index of :data:`LIST_INDEXES`, in order."""
    return [index_command(collection, index) for index in LIST_INDEXES]


def exemption_command(collection: str, path: str) -> str:
    """The ``gcloud`` command that exempts ``path`` from single-field indexing."""
    return (
        f"gcloud firestore indexes fields update {path} --collection-group={collection} "
        "--disable-indexes"
    )


def exemption_commands(collection: str) -> list[str]:
    """An :func:`exemption_command` per field of :data:`EXEMPT_FIELDS`, in order."""
    return [exemption_command(collection, path) for path in EXEMPT_FIELDS]


def ttl_command(collection: str) -> str:
    """The ``gcloud`` command that points a TTL policy at ``expire_at``."""
    return (
        f"gcloud firestore fields ttls update expire_at --collection-group={collection} "
        "--enable-ttl"
    )


def has_index(indexes: Iterable[Any], wanted: tuple[IndexField, ...]) -> bool:
    """Whether the Admin API's ``Index`` messages hold ``wanted`` (collection scope)."""
    want = [(f.path, "DESCENDING" if f.descending else "ASCENDING") for f in wanted]
    for index in indexes:
        if getattr(index.query_scope, "name", "") != "COLLECTION":
            continue
        fields = [(f.field_path, f.order.name) for f in index.fields if f.field_path != "__name__"]
        if fields == want:
            return True
    return False


def still_indexed(overrides: Iterable[Any]) -> list[str]:
    """The fields of :data:`EXEMPT_FIELDS` not exempt in the Admin API's ``overrides``, in order.

    ``overrides`` are the ``Field`` messages ``ListFields`` returns for the
    collection group with the filter ``indexConfig.usesAncestorConfig:false``
    (the fields whose index settings were set explicitly). A field is exempt
    when its own settings list no index and are not being reverted; a map
    field's exemption covers its subfields, which is why ``steps`` and
    ``outbox`` are exempt as wholes.
    """
    exempt = set()
    for field in overrides:
        path = str(field.name).rsplit("/fields/", 1)[-1]
        config = field.index_config
        if not config.uses_ancestor_config and not config.reverting and not config.indexes:
            exempt.add(path)
    return [path for path in EXEMPT_FIELDS if path not in exempt]


def index_hints(collection: str, indexes: Iterable[Any]) -> list[str]:
    """What ``jobs list``'s indexes lack, with the command that creates each.

    ``indexes`` are the Admin API's ``Index`` messages of the collection
    group. Empty when the indexes are as :data:`LIST_INDEXES` wants them.
    """
    indexes = list(indexes)
    return [
        f"`jobs list` lacks a composite index; create it: {index_command(collection, index)}"
        for index in LIST_INDEXES
        if not has_index(indexes, index)
    ]


def dashboard_index_hints(collection: str, indexes: Iterable[Any]) -> list[str]:
    """The :data:`DASHBOARD_INDEXES` missing from ``indexes``, each with its command."""
    indexes = list(indexes)
    return [
        f"`pubsub-worker ui` lacks a composite index; create it: {index_command(collection, i)}"
        for i in DASHBOARD_INDEXES
        if not has_index(indexes, i)
    ]


def exemption_hints(collection: str, overrides: Iterable[Any]) -> list[str]:
    """A line per field of :data:`EXEMPT_FIELDS` still indexed (:func:`still_indexed`): why it
    need not be, and the command that exempts it. Empty when every one is exempt."""
    return [
        f"{path} is indexed ({EXEMPT_FIELDS[path]}); exempt it: "
        f"{exemption_command(collection, path)}"
        for path in still_indexed(overrides)
    ]
