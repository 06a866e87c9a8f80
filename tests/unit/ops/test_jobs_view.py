"""What ``jobs show``, ``jobs list`` and ``jobs release`` make of a job document, in memory.

The store is the in-memory one with a hand-moved clock playing Firestore's,
so the lease shown is judged exactly as a claim judges it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from pubsub_worker._job.claim import Claim, ClaimKind, ClaimRequest, claim
from pubsub_worker._job.keys import derive_identity, document_id
from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops import jobs_view
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, ReplayResult
from pubsub_worker.cli import jobs as cli_jobs
from pubsub_worker.cli import replay as cli_replay
from pubsub_worker.cli.output import Column, plain_table
from pubsub_worker.errors import VersionConflict
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores import layout as job_layout
from pubsub_worker.stores.base import Changes, JobRecord, Snapshot, Status
from pubsub_worker.stores.layout import IndexMissing

SUB = "projects/proj/subscriptions/sub"
ROOT = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 5, 1, 10, 0, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def claimed(
    store: MemoryJobStore, key: str, *, owner: str = "host/1/aa", lease_s: float = 30
) -> tuple[str, Claim]:
    identity = derive_identity(
        subscription=SUB,
        message_id="m-" + str(abs(hash(key))),
        attributes={"op": key},
        data=b"doc",
        key_attribute="op",
    )
    request = ClaimRequest(
        identity=identity,
        owner=owner,
        message_id="m-1",
        delivery="d-1",
        lease_s=lease_s,
        retention_s=3600,
        abandoned=lambda _m, _d: False,
    )
    result = claim(store, request)
    assert result.kind is ClaimKind.CLAIMED
    return identity.doc_id, result


def commit_step(
    store: MemoryJobStore, doc_id: str, version: object, name: str, result: str
) -> object:
    at = datetime(2025, 5, 1, 10, 0, 1, tzinfo=timezone.utc)
    return store.update(
        doc_id, {("steps", name): {"result": result, "epoch": 1, "at": at}}, expected=version
    )


def test_show_reports_status_owner_lease_on_the_stores_clock_steps_and_sizes() -> None:
    clock = Clock()
    store = MemoryJobStore(clock=clock)
    doc_id, first = claimed(store, "claim-42", lease_s=30)
    commit_step(store, doc_id, first.version, "upload", json.dumps("x" * 10))
    clock.now += timedelta(seconds=12)

    view = job_ops.show(store, SUB, "claim-42")

    assert view is not None
    assert (view.key, view.status, view.epoch, view.attempts) == ("claim-42", Status.RUNNING, 1, 1)
    assert view.owner == "host/1/aa"
    assert view.lease_left_s == pytest.approx(18, abs=0.01)  # 30 s from the step's write
    assert [(s.name, s.epoch, s.size_bytes) for s in view.steps] == [("upload", 1, 12)]
    text = jobs_view.render_job(view)
    assert "status       running (epoch 1, attempts 1)" in text
    assert "lease        18 s left of 30 s (Firestore's clock)" in text
    assert "upload  epoch 1  2025-05-01 10:00:01 UTC  12 B" in text
    doc = view.to_json()
    assert doc["status"] == "running"
    assert doc["steps"] == [
        {"name": "upload", "epoch": 1, "at": "2025-05-01T10:00:01+00:00", "size_bytes": 12}
    ]
    assert json.loads(json.dumps(doc)) == doc
    assert job_ops.show(store, SUB, "no-such-key") is None


def test_a_hostile_key_cannot_forge_lines_or_send_terminal_escapes() -> None:
    store = MemoryJobStore()
    key = "ok\n\x1b[31mjob fake status completed\r\u202e"
    claimed(store, key)
    view = job_ops.show(store, SUB, key)
    assert view is not None
    assert view.key == key
    table = plain_table(
        [Column(header) for header in jobs_view.LIST_HEADER], [jobs_view.list_row(view)]
    )
    for text in (jobs_view.render_job(view), "\n".join(table)):
        assert "\x1b" not in text
        assert "\r" not in text
        assert "\u202e" not in text
        assert "ok\\n\\x1b[31mjob fake status completed\\r" in text
    assert "\\u202e" in jobs_view.render_job(view)  # the table clips the key at 40 bytes
    assert len(table) == 2


def test_release_bumps_the_epoch_keeps_the_steps_and_fences_the_owner() -> None:
    store = MemoryJobStore()
    doc_id, first = claimed(store, "claim-42")
    version = commit_step(store, doc_id, first.version, "a", "1")

    result = job_ops.release(store, SUB, "claim-42", expect_epoch=1)

    assert result.kind is job_ops.ReleaseOutcome.RELEASED
    assert result.ok
    assert (result.before.epoch if result.before else None, result.epoch) == (1, 2)
    snap = store.get(doc_id)
    assert snap is not None
    record = JobRecord.parse(snap.fields)
    assert (record.status, record.epoch, record.attempts) == (Status.RELEASED, 2, 1)
    assert list(record.steps) == ["a"]
    assert record.lease_expires_at is None
    with pytest.raises(VersionConflict):  # the stuck owner's next write
        store.update(doc_id, {("steps", "b"): {"result": "2", "epoch": 1}}, expected=version)
    again = job_ops.release(store, SUB, "claim-42")
    assert again.kind is job_ops.ReleaseOutcome.ALREADY_RELEASED
    assert again.ok
    assert JobRecord.parse(store.get(doc_id).fields).epoch == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
def test_release_refuses_completed_and_failed_jobs_and_writes_nothing(status: Status) -> None:
    store = MemoryJobStore()
    doc_id, first = claimed(store, "k")
    store.update(doc_id, {("status",): status.value}, expected=first.version)
    writes = store.writes

    result = job_ops.release(store, SUB, "k")

    assert result.kind is job_ops.ReleaseOutcome.REFUSED
    assert not result.ok
    assert ("jobs replay" in result.detail) == (status is Status.FAILED)
    assert store.writes == writes


def test_release_at_a_stale_epoch_or_of_an_unknown_key_writes_nothing() -> None:
    store = MemoryJobStore()
    claimed(store, "k")
    writes = store.writes
    stale = job_ops.release(store, SUB, "k", expect_epoch=7)
    assert stale.kind is job_ops.ReleaseOutcome.REFUSED
    assert "at epoch 1, not 7" in stale.detail
    assert job_ops.release(store, SUB, "other").kind is job_ops.ReleaseOutcome.NOT_FOUND
    assert store.writes == writes


def test_release_that_races_a_writer_reports_a_conflict() -> None:
    store = MemoryJobStore()
    doc_id, _ = claimed(store, "k")

    class WriteAfterRead:
        """The store, with another writer landing right after each read of the job."""

        def get(self, wanted: str) -> Snapshot | None:
            snap = store.get(wanted)
            if snap is not None and wanted == doc_id:
                store.update(doc_id, {("error",): "written meanwhile"}, expected=snap.version)
            return snap

        def create(self, wanted: str, fields: Mapping[str, Any]) -> object:
            return store.create(wanted, fields)

        def update(self, wanted: str, changes: Changes, *, expected: object) -> object:
            return store.update(wanted, changes, expected=expected)

    result = job_ops.release(WriteAfterRead(), SUB, "k")
    assert result.kind is job_ops.ReleaseOutcome.CONFLICT
    assert JobRecord.parse(store.get(doc_id).fields).epoch == 1  # type: ignore[union-attr]


def test_a_cursor_round_trips_to_the_microsecond_and_rejects_garbage() -> None:
    at = datetime(2025, 5, 1, 10, 0, 0, 123456, tzinfo=timezone.utc)
    doc_id = document_id(SUB, "k")
    assert job_ops.decode_cursor(job_ops.encode_cursor(at, doc_id)) == (at, doc_id)
    for bad in ("", "abc", "12", "x-y", "-abc"):
        with pytest.raises(ValueError, match="not a page cursor"):
            job_ops.decode_cursor(bad)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("30s", 30), ("10m", 600), ("1h30m", 5400), ("2d", 172800), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert cli_jobs.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "m", "10m5", "ten minutes", "-5m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(Exception, match="expected a duration"):
        cli_jobs.parse_duration(text)


class RefusingQuery:
    """A Firestore query chain that answers like production without the composite index."""

    def collection(self, _name: str) -> RefusingQuery:
        return self

    def where(self, **_kwargs: Any) -> RefusingQuery:
        return self

    def order_by(self, *_args: Any, **_kwargs: Any) -> RefusingQuery:
        return self

    def limit(self, _n: int) -> RefusingQuery:
        return self

    def stream(self) -> list[Any]:
        refusal: Any = gexc.FailedPrecondition  # the exception classes are untyped
        raise refusal("The query requires an index. You can create it here: …")


def test_a_listing_without_its_index_says_which_command_creates_it() -> None:
    with pytest.raises(IndexMissing) as missing:
        job_ops.list_jobs(RefusingQuery(), "jobs", SUB, status=Status.RUNNING, older_than_s=600)
    assert missing.value.command == job_layout.index_commands("jobs")[1]
    assert "The query requires an index" in str(missing.value)


def test_the_replay_summary_counts_what_was_not_replayed_by_reason() -> None:
    def result(kind: ReplayOutcome, reason: str | None = None) -> ReplayResult:
        record = JobRecord.parse({"key": "k", "epoch": 1})
        return ReplayResult(FailedJob("d", record), kind, reason)

    results = [
        result(ReplayOutcome.REPLAYED),
        result(ReplayOutcome.SKIPPED, "running"),
        result(ReplayOutcome.SKIPPED, "running"),
        result(ReplayOutcome.SKIPPED, "replayed moments ago (3 s); its message may be on its way"),
        result(ReplayOutcome.FAILED, "reset, but publishing failed (Timeout: x); replay it again"),
    ]
    assert cli_replay.summary(results, dry_run=False) == [
        "  skipped 3: running (2), replayed moments ago (1)",
        "  failed 1: reset, but publishing failed (1)",
    ]
    assert cli_replay.summary(results[:1], dry_run=True) == [
        "  dry run: nothing was written or published"
    ]
