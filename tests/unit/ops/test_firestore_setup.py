"""The Firestore set-up of the job layout: shards, listing indexes, exemptions, and their checks.

Pure: the shipped ``firestore.indexes.json`` and ``docs/operations.md`` are
read from the repository, and the Admin API's answers are built from its
own message types, so a verdict is judged on what Firestore would send.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore_admin_v1 as admin_v1

from pubsub_worker import Settings
from pubsub_worker._job.keys import document_id
from pubsub_worker._ops import config_check as cc
from pubsub_worker._ops.firestore_check import firestore_setup
from pubsub_worker.stores import base as s
from pubsub_worker.stores import layout as jl
from pubsub_worker.stores.base import Status

ROOT = Path(__file__).resolve().parents[3]
SUB = "projects/proj/subscriptions/sub"
PARENT = "projects/proj/databases/(default)/collectionGroups/jobs"
COLLECTION = "pubsub_worker_jobs"  # the shipped file's and the doc's collection group


# -- shards ---------------------------------------------------------------------------


def test_a_documents_shard_is_stable_and_every_shard_is_used() -> None:
    ids = [document_id(SUB, f"order-{i}") for i in range(400)]
    shards = [s.shard_of(doc_id) for doc_id in ids]
    assert shards == [s.shard_of(doc_id) for doc_id in ids]  # same id, same shard
    assert set(shards) == set(range(s.SHARDS))
    # One `in` filter takes every shard: Firestore (and the emulator) accept at most 30 values.
    assert 1 < s.SHARDS <= 30


# -- listing indexes ----------------------------------------------------------------


@pytest.mark.parametrize("status", [None, *Status])
@pytest.mark.parametrize("older_than", [False, True])
def test_every_listing_query_has_its_composite_index(
    status: Status | None, older_than: bool
) -> None:
    shape = jl.list_query_shape(status, older_than=older_than)
    assert shape.index() in jl.LIST_INDEXES
    # Firestore: a range filter must be on the first order-by field.
    assert shape.range_field in (None, shape.order.path)


@pytest.mark.parametrize("older_than", [False, True])
def test_every_query_of_the_dashboard_has_its_composite_index(older_than: bool) -> None:
    by_reason = jl.list_query_shape(Status.FAILED, older_than=older_than, reason=True)
    assert by_reason.index() == jl.DASHBOARD_INDEXES[0]
    assert [f.path for f in by_reason.index()][:3] == [s.SUBSCRIPTION, s.STATUS, s.REASON]
    # Counting stuck jobs is the listing's --older-than shape: no index of its own.
    stuck = jl.list_query_shape(Status.RUNNING, older_than=older_than)
    assert stuck.index() in jl.LIST_INDEXES
    # The reason index is all the dashboard adds: its other numbers are `jobs stats`'s.
    assert (by_reason.index(),) == jl.DASHBOARD_INDEXES
    assert not set(jl.DASHBOARD_INDEXES) & set(jl.LIST_INDEXES)


def test_every_listing_index_puts_the_shard_before_the_timestamp() -> None:
    for index in jl.LIST_INDEXES + jl.DASHBOARD_INDEXES:
        paths = [f.path for f in index]
        assert paths.index(s.SHARD) == len(paths) - 2
        assert paths[-1] == s.UPDATED_AT


# -- exemptions ---------------------------------------------------------------------


def layout_fields() -> set[str]:
    """Every field name the layout defines (the string constants of stores.base)."""
    return {
        value for name in s.__all__ if name.isupper() and isinstance(value := getattr(s, name), str)
    }


def test_every_field_of_the_layout_is_queried_or_exempt() -> None:
    exempt = set(jl.EXEMPT_FIELDS)
    queried = set(jl.QUERIED_FIELDS)
    assert exempt.isdisjoint(queried)
    assert exempt | queried == layout_fields()
    # What the issue named: the sequential and the large ones are among them.
    sequential = {s.UPDATED_AT, s.LEASE_EXPIRES_AT, s.EXPIRE_AT, s.FIRST_SEEN_AT, s.MESSAGE_ID}
    large = {s.STEPS, s.OUTBOX, s.DATA, s.ATTRIBUTES, s.ERROR}
    assert sequential | large <= exempt


def _doc_commands(pattern: str) -> list[str]:
    text = (ROOT / "docs/operations.md").read_text().replace("\\\n  ", "")
    return re.findall(pattern, text)


def test_the_shipped_index_file_and_the_doc_list_the_same_indexes_and_overrides() -> None:
    shipped = json.loads((ROOT / "samples/cloud_run/firestore.indexes.json").read_text())
    assert shipped == jl.indexes_json(COLLECTION)
    overrides = [o["fieldPath"] for o in shipped["fieldOverrides"]]
    assert overrides == list(jl.EXEMPT_FIELDS)
    assert all(o["indexes"] == [] for o in shipped["fieldOverrides"])
    assert [o["fieldPath"] for o in shipped["fieldOverrides"] if o.get("ttl")] == [s.EXPIRE_AT]

    documented = _doc_commands(r"gcloud firestore indexes fields update \S+ [^\n`]*")
    assert documented == jl.exemption_commands(COLLECTION)
    exempted = [command.split()[5] for command in documented]
    assert sorted(exempted) == sorted(overrides)

    composite = _doc_commands(r"gcloud firestore indexes composite create [^\n`]*")
    assert composite == jl.index_commands(COLLECTION)
    assert jl.index_commands("jobs")[1] == (
        "gcloud firestore indexes composite create --collection-group=jobs "
        "--field-config=field-path=subscription,order=ascending "
        "--field-config=field-path=status,order=ascending "
        "--field-config=field-path=shard,order=ascending "
        "--field-config=field-path=updated_at,order=descending"
    )
    assert jl.exemption_command("jobs", "steps") == (
        "gcloud firestore indexes fields update steps --collection-group=jobs --disable-indexes"
    )


def field(path: str, *, indexes: Iterable[str] = (), **config: Any) -> admin_v1.Field:
    """An explicit override as ListFields returns it: its indexes by order, or none."""
    return admin_v1.Field(
        name=f"{PARENT}/fields/{path}",
        index_config=admin_v1.Field.IndexConfig(
            indexes=[
                admin_v1.Index(query_scope="COLLECTION", fields=[{"field_path": path, "order": o}])
                for o in indexes
            ],
            **config,
        ),
    )


def exempt_all() -> list[admin_v1.Field]:
    return [field(path) for path in jl.EXEMPT_FIELDS]


def path_of(override: admin_v1.Field) -> str:
    return str(override.name).rsplit("/fields/", 1)[-1]


def test_still_indexed_names_each_field_whose_override_keeps_an_index() -> None:
    assert jl.still_indexed([]) == list(jl.EXEMPT_FIELDS)
    assert jl.still_indexed(exempt_all()) == []

    others = [f for f in exempt_all() if path_of(f) not in {s.UPDATED_AT, s.STEPS, s.OUTBOX}]
    answer = [
        *others,
        field(s.STATUS, indexes=["ASCENDING"]),  # a queried field: never a finding
        field("steps.upload"),  # a subfield's exemption leaves the map itself indexed
        field(s.STEPS, indexes=["ASCENDING", "DESCENDING"]),
        field(s.OUTBOX, reverting=True),  # going back to the defaults: indexed again
    ]
    assert jl.still_indexed(answer) == [s.STEPS, s.OUTBOX, s.UPDATED_AT]


# -- the checks, on a faked Admin API -----------------------------------------------


class FakeAdmin:
    """The three Admin API calls the checks make, answering from given objects."""

    def __init__(
        self,
        *,
        ttl_state: str = "ACTIVE",
        indexes: list[admin_v1.Index] | None = None,
        overrides: list[admin_v1.Field] | None = None,
        refuse: Exception | None = None,
    ) -> None:
        self.ttl = admin_v1.Field(ttl_config=admin_v1.Field.TtlConfig(state=ttl_state))
        every = jl.LIST_INDEXES + jl.DASHBOARD_INDEXES
        self.indexes = indexes if indexes is not None else [index(i) for i in every]
        self.overrides = overrides if overrides is not None else exempt_all()
        self.refuse = refuse
        self.asked: list[dict[str, Any]] = []

    def get_field(self, *, name: str, timeout: float) -> admin_v1.Field:
        assert name == f"{PARENT}/fields/expire_at"
        return self.ttl

    def list_indexes(self, *, parent: str, timeout: float) -> list[admin_v1.Index]:
        assert parent == PARENT
        return self.indexes

    def list_fields(self, *, request: dict[str, Any], timeout: float) -> list[admin_v1.Field]:
        self.asked.append(request)
        if self.refuse is not None:
            raise self.refuse
        return self.overrides


def index(fields: tuple[jl.IndexField, ...], index_id: str = "CICAgOjXh4EK") -> admin_v1.Index:
    return admin_v1.Index(
        name=f"{PARENT}/indexes/{index_id}",
        query_scope="COLLECTION",
        fields=[
            admin_v1.Index.IndexField(
                field_path=f.path, order="DESCENDING" if f.descending else "ASCENDING"
            )
            for f in fields
        ]
        + [admin_v1.Index.IndexField(field_path="__name__", order="DESCENDING")],
    )


def setup_checks(admin: Any) -> list[cc.Check]:
    settings_ = Settings(subscription=SUB, project="proj", collection="jobs", lease_seconds=60)
    return firestore_setup(settings_, admin)


def by_name(checks: list[cc.Check], name: str) -> list[cc.Check]:
    return [c for c in checks if c.name == name]


def test_a_database_set_up_as_documented_passes_every_setup_check() -> None:
    admin = FakeAdmin()
    checks = setup_checks(lambda: admin)
    assert [(c.name, c.level) for c in checks] == [
        ("TTL policy", cc.Level.OK),
        ("indexes", cc.Level.OK),
        ("dashboard indexes", cc.Level.OK),
        ("index exemptions", cc.Level.OK),
    ]
    assert admin.asked == [{"parent": PARENT, "filter": "indexConfig.usesAncestorConfig:false"}]
    assert by_name(checks, "index exemptions")[0].detail == (
        f"the {len(jl.EXEMPT_FIELDS)} fields no query reads are not indexed"
    )


def test_each_field_still_indexed_is_a_hint_with_the_command_that_exempts_it() -> None:
    kept = {s.UPDATED_AT, s.STEPS, s.MESSAGE_ID}
    admin = FakeAdmin(overrides=[f for f in exempt_all() if path_of(f) not in kept])
    hints = by_name(setup_checks(lambda: admin), "index exemptions")
    assert [h.level for h in hints] == [cc.Level.HINT] * 3
    assert [h.detail.split(" ", 1)[0] for h in hints] == [s.MESSAGE_ID, s.STEPS, s.UPDATED_AT]
    for hint in hints:
        path = hint.detail.split(" ", 1)[0]
        assert hint.detail == (
            f"{path} is indexed ({jl.EXEMPT_FIELDS[path]}); exempt it: "
            f"gcloud firestore indexes fields update {path} --collection-group=jobs "
            "--disable-indexes"
        )

    fresh = by_name(setup_checks(lambda: FakeAdmin(overrides=[])), "index exemptions")
    assert len(fresh) == len(jl.EXEMPT_FIELDS)


def test_missing_listing_indexes_are_hints_with_their_commands() -> None:
    admin = FakeAdmin(ttl_state="STATE_UNSPECIFIED", indexes=[index(jl.LIST_INDEXES[0])])
    checks = setup_checks(lambda: admin)
    assert by_name(checks, "TTL policy")[0].level is cc.Level.HINT
    assert jl.ttl_command("jobs") in by_name(checks, "TTL policy")[0].detail
    hints = by_name(checks, "indexes")
    assert [h.level for h in hints] == [cc.Level.HINT]
    assert hints[0].detail == (
        "`jobs list` lacks a composite index; create it: " + jl.index_commands("jobs")[1]
    )


def test_a_missing_dashboard_index_is_a_hint_with_its_command() -> None:
    admin = FakeAdmin(indexes=[index(i) for i in jl.LIST_INDEXES])
    (hint,) = by_name(setup_checks(lambda: admin), "dashboard indexes")
    assert hint.level is cc.Level.HINT
    assert hint.detail == (
        "`pubsub-worker ui` lacks a composite index; create it: "
        "gcloud firestore indexes composite create --collection-group=jobs "
        "--field-config=field-path=subscription,order=ascending "
        "--field-config=field-path=status,order=ascending "
        "--field-config=field-path=reason,order=ascending "
        "--field-config=field-path=shard,order=ascending "
        "--field-config=field-path=updated_at,order=descending"
    )
    assert by_name(setup_checks(lambda: admin), "indexes")[0].level is cc.Level.OK


def test_without_admin_access_or_on_the_emulator_the_exemptions_are_hints_that_say_why() -> None:
    refusal: Any = gexc.PermissionDenied  # the exception classes are untyped
    denied = FakeAdmin(refuse=refusal("datastore.indexes.list"))
    checks = setup_checks(lambda: denied)
    assert [(c.name, c.level) for c in checks] == [
        ("TTL policy", cc.Level.HINT),
        ("indexes", cc.Level.HINT),
        ("dashboard indexes", cc.Level.HINT),
        ("index exemptions", cc.Level.HINT),
    ]
    assert "could not check: PermissionDenied" in checks[3].detail

    emulator = setup_checks(None)
    (exemptions,) = by_name(emulator, "index exemptions")
    assert exemptions.level is cc.Level.HINT
    assert exemptions.detail.startswith("does not apply to the emulator")
