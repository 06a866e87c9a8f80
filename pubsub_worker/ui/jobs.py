"""The dashboard's one door to the jobs: what ``pubsub-worker jobs`` runs, and nothing else.

Every read and write of the dashboard goes through this module, and this
module goes through :mod:`pubsub_worker._ops` only: the listing is
:func:`~pubsub_worker._ops.jobs.list_jobs` (the same query, index and cursor
as ``jobs list``), a job is :func:`~pubsub_worker._ops.jobs.show`'s view of its
document, a release is :func:`~pubsub_worker._ops.jobs.release` and a replay
:func:`~pubsub_worker._ops.replay.replay`, both fenced exactly as on the
command line. The numbers of the overview are ``jobs stats``'s
(:func:`~pubsub_worker._ops.stats.job_stats`, its counts sent together), those
of the review queue a count per failure reason
(:func:`~pubsub_worker._ops.job_counts.reason_counts`): ``count()``
aggregations on the listing index. A signature change there is a change
here, in one place.

A key prefix has no index (``key`` is exempt from indexing: keys are often
sequential, and an index on them would take every new job at one end). It
narrows the rows of the indexed listing instead: a page reads at most
:data:`SCAN_BUDGET` documents in the listing's order and, when it found fewer
matches than a page, hands back the cursor where it stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from pubsub_worker._job.keys import document_id
from pubsub_worker._job.lease import now_utc
from pubsub_worker._ops import job_counts, replay_route, stats
from pubsub_worker._ops import jobs as job_ops
from pubsub_worker._ops.jobs_view import JobView
from pubsub_worker._ops.replay import FailedJob, ReplayResult, replay, why_not_replayable
from pubsub_worker._support import clients
from pubsub_worker.settings import Settings
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores.base import JobRecord, Snapshot, Status
from pubsub_worker.stores.job_index import FirestoreJobIndex
from pubsub_worker.stores.layout import IndexMissing

from .filters import Filters
from .shapes import Counts, JobDetail, ListPage, Review, Subscription

__all__ = [
    "MAX_BULK",
    "PAGE",
    "SCAN_BUDGET",
    "Counts",
    "JobDetail",
    "Jobs",
    "ListPage",
    "Review",
    "Subscription",
]

PAGE = 50
"""Rows of a page of the job list (``jobs list``'s default too)."""
SCAN_BUDGET = 1000
"""Documents a page filtered by key prefix reads at most before it hands back its cursor."""
_SCAN_BATCH = 500
MAX_BULK = 500
"""Jobs one bulk replay checks and replays at most (the newest first); run it again for more."""
RECENT = 8
"""Failures the overview shows."""
SAMPLED = 50
"""Newest failed jobs the review queue reads to show a few of each reason."""


class Jobs:
    """The jobs of the dashboard's subscriptions, in one collection, read and changed via _ops."""

    def __init__(
        self,
        settings: Settings,
        subscriptions: Sequence[str] = (),
        *,
        client: Any = None,
        publish: clients.Publish | None = None,
    ) -> None:
        by_path: dict[str, Settings] = {}
        for name in subscriptions or [settings.subscription_path]:
            named = settings.model_copy(update={"subscription": name})
            by_path.setdefault(named.subscription_path, named)  # a name and its path: once
        self.subscriptions = [Subscription(i, s) for i, s in enumerate(by_path.values())]
        self.settings = settings
        self.client = client if client is not None else clients.firestore_client(settings)
        self.store = FirestoreJobStore(self.client, settings.collection)
        self.collection = settings.collection
        self._publish = publish
        self._topics: dict[str, str] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pubsub-worker-ui")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def subscription(self, path: str | None) -> Subscription:
        """The subscription of ``path`` (the first when None); ``KeyError`` if not shown here."""
        if path is None:
            return self.subscriptions[0]
        for sub in self.subscriptions:
            if path in (sub.path, sub.name):
                return sub
        raise KeyError(path)

    # -- reads ------------------------------------------------------------------------

    def index(self, sub: Subscription) -> FirestoreJobIndex:
        """The listing index of ``sub``'s jobs, as ``jobs stats`` reads it."""
        return FirestoreJobIndex(self.client, self.collection, sub.path)

    def counts(self, sub: Subscription) -> Counts:
        """``jobs stats`` of ``sub`` (counts sent at once), the stuck counted after a lease."""
        try:
            found = stats.job_stats(
                self.index(sub),
                stuck_after_s=float(sub.settings.lease_seconds),
                executor=self._pool,
            )
        except IndexMissing as exc:
            return Counts.unknown(exc.command)
        return Counts.of(found)

    def review(self, sub: Subscription) -> Review:
        """Failed jobs by reason (one ``count()`` each) and the newest failed ones: at once."""
        newest = self._pool.submit(self.latest, sub, Status.FAILED, SAMPLED)
        missing: tuple[str, ...] = ()
        try:
            reasons = job_counts.reason_counts(self.index(sub), self._pool)
        except IndexMissing as exc:
            reasons, missing = job_counts.ReasonCounts.of(0, {}), (exc.command,)
        samples: dict[str, list[JobView]] = {}
        for view in newest.result().jobs:
            samples.setdefault(view.reason or "error", []).append(view)
        return Review(reasons=reasons, samples=samples, missing=missing)

    def count_failed(self, sub: Subscription, reason: str | None) -> int:
        """Failed jobs of ``sub`` (of ``reason``): what a bulk replay's preview says it holds."""
        return self.index(sub).count(Status.FAILED, reason=reason)

    def latest(
        self, sub: Subscription, status: Status, limit: int, reason: str | None = None
    ) -> job_ops.Page:
        """The newest ``limit`` jobs of ``status`` (and ``reason``): the overview's, the queue's."""
        return job_ops.list_jobs(
            self.client, self.collection, sub.path, status=status, reason=reason, limit=limit
        )

    def page(self, sub: Subscription, filters: Filters, limit: int = PAGE) -> ListPage:
        """A page of the job list; see the module docstring for the key prefix."""
        now = now_utc()
        older = (now - filters.until).total_seconds() if filters.until is not None else None
        exact = self.show(sub, filters.prefix) if filters.prefix else None
        rows: list[JobView] = []
        scanned = 0
        cursor = filters.after
        while True:
            batch = _SCAN_BATCH if filters.prefix else limit
            got = job_ops.list_jobs(
                self.client,
                self.collection,
                sub.path,
                status=filters.status,
                reason=filters.reason,
                older_than_s=older,
                limit=batch,
                after=cursor,
                now=now,
            )
            for index, view in enumerate(got.jobs):
                if _before(view.updated_at, filters.since):
                    return ListPage(rows, None, scanned, exact)
                scanned += 1
                assert view.updated_at is not None  # listed: ordered by it
                cursor = job_ops.encode_cursor(view.updated_at, view.doc_id)
                if filters.matches(view):
                    rows.append(view)
                if len(rows) >= limit:
                    more = index < len(got.jobs) - 1 or got.next is not None
                    return ListPage(rows, cursor if more else None, scanned, exact)
            if got.next is None:
                return ListPage(rows, None, scanned, exact)
            cursor = got.next
            if scanned >= SCAN_BUDGET:
                return ListPage(rows, cursor, scanned, exact)

    def show(self, sub: Subscription, key: str) -> JobView | None:
        """The job of ``key`` (``jobs show KEY``)."""
        return job_ops.show(self.store, sub.path, key)

    def detail(self, doc_id: str) -> JobDetail | None:
        """The job of document ``doc_id`` with what may be done to it; None if not found here."""
        snapshot = self.store.get(doc_id)
        if snapshot is None:
            return None
        now = now_utc()
        view = JobView.from_snapshot(doc_id, snapshot, now)
        record = JobRecord.parse(snapshot.fields)
        try:
            sub = self.subscription(record.subscription) if record.subscription else None
        except KeyError:
            sub = None
        return JobDetail(
            view=view,
            record=record,
            subscription=sub,
            replay_refusal=self._replay_refusal(record, snapshot, now, sub),
            release_refusal=_release_refusal(view, sub),
        )

    def _replay_refusal(
        self, record: JobRecord, snapshot: Snapshot, now: datetime, sub: Subscription | None
    ) -> str | None:
        if sub is None:
            return "its subscription is not one this dashboard shows"
        return why_not_replayable(
            record, snapshot, now, timeout_s=float(sub.settings.ack_timeout_seconds)
        )

    def failed(
        self, sub: Subscription, reason: str | None, limit: int = MAX_BULK
    ) -> list[FailedJob]:
        """The newest ``limit`` failed jobs (of ``reason``), for a bulk replay: the listing."""
        page = job_ops.list_jobs(
            self.client,
            self.collection,
            sub.path,
            status=Status.FAILED,
            reason=reason,
            limit=limit,
        )
        return self.by_ids(sub, [view.doc_id for view in page.jobs])

    def by_ids(self, sub: Subscription, doc_ids: Iterable[str]) -> list[FailedJob]:
        """The documents of ``doc_ids`` that belong to ``sub``, in order, as replay takes them."""
        ids = list(dict.fromkeys(doc_ids))
        refs = [self.client.collection(self.collection).document(i) for i in ids]
        found = {snap.id: snap for snap in self.client.get_all(refs) if snap.exists}
        jobs = [FailedJob(i, JobRecord.parse(found[i].to_dict() or {})) for i in ids if i in found]
        return [job for job in jobs if job.record.subscription == sub.path]

    # -- writes -----------------------------------------------------------------------

    def replay(
        self,
        sub: Subscription,
        jobs: Sequence[FailedJob],
        *,
        dry_run: bool,
        progress: Callable[[int, ReplayResult], None] = lambda _i, _r: None,
    ) -> list[ReplayResult]:
        """``jobs replay``: each job reset (fenced) and its message published to its topic."""
        return replay(
            self.store,
            jobs,
            topic=self.topic(sub),
            publish=self._publisher(),
            key_attribute=sub.settings.key_attribute,
            dry_run=dry_run,
            progress=progress,
            timeout_s=float(sub.settings.ack_timeout_seconds),
        )

    def release(self, sub: Subscription, key: str, epoch: int) -> job_ops.ReleaseResult:
        """``jobs release KEY --epoch N``: only while the job is still at the epoch shown."""
        return job_ops.release(self.store, sub.path, key, expect_epoch=epoch)

    def topic(self, sub: Subscription) -> str:
        """Where ``jobs replay`` publishes: the subscription's replay topic (read once).

        ``ConfigError`` (said on the page) when it has none: a replay would otherwise reach
        every subscription of the topic (:mod:`pubsub_worker._ops.replay_route`).
        """
        with self._lock:
            if sub.path not in self._topics:
                subscriber = clients.subscriber_client(sub.settings)
                try:
                    found = replay_route.route(
                        sub.settings,
                        subscriber=subscriber,
                        publisher=clients.publisher_client(sub.settings),
                        fan_out=False,
                    )
                finally:
                    subscriber.close()
                self._topics[sub.path] = found.topic
            return self._topics[sub.path]

    def _publisher(self) -> clients.Publish:
        with self._lock:
            if self._publish is None:
                publisher = clients.publisher_client(self.settings)
                self._publish = clients.publisher_function(publisher)
            return self._publish


def _before(at: datetime | None, since: datetime | None) -> bool:
    return since is not None and at is not None and at < since


def _release_refusal(view: JobView, sub: Subscription | None) -> str | None:
    """Why the dashboard offers no release (the release itself checks again, fenced)."""
    if sub is None:
        return "its subscription is not one this dashboard shows"
    if not view.is_job:
        return "rejected before it became a job: there is no claim to release"
    if view.status not in (Status.RUNNING, Status.RELEASED):
        return f"{view.status.value}: only a running job is released"
    if view.key is None or document_id(sub.path, view.key) != view.doc_id:
        return "its key is longer than the stored copy: release it with the CLI and its full key"
    return None
