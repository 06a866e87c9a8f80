"""Release and replay from the dashboard: asked, previewed by a dry run, confirmed, logged.

Only with ``--allow-actions``; otherwise these pages answer 403 and no page
links to them. Each action takes two requests:

1. a GET that changes nothing: for a replay, the dry run of
   :func:`~pubsub_worker._ops.replay.replay` over the jobs it would take (a
   reason group of the review queue: its :data:`~pubsub_worker.ui.jobs.MAX_BULK`
   newest failed jobs; or one job), with what each would do and why some
   would be skipped; for a release, the job as read and the epoch it is at;
2. the POST of that page's form (CSRF token checked,
   :class:`~pubsub_worker.ui.security.Guard`), which acts on exactly what was
   shown: the replay takes the document ids the dry run would replay (each is
   read and judged again by the replay itself, fenced), the release is
   ``jobs release KEY --epoch N`` at the epoch shown, so a job claimed since
   is left alone.

Every POST is logged (logger ``pubsub_worker.ui``) with who, from where, and
what it did; each replayed job's line carries its key and message id.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pubsub_worker._ops.job_counts import FAILURE_REASONS
from pubsub_worker._ops.replay import FailedJob, ReplayOutcome, ReplayResult
from pubsub_worker._support.logs import job_logger, printable

from .jobs import MAX_BULK, Subscription
from .pages import Dashboard, guarded, is_doc_id
from .security import actor

__all__ = ["action_routes"]

_LOGGER = logging.getLogger("pubsub_worker.ui")
_MAX_FORM_BYTES = 256 * 1024


def _forbidden(d: Dashboard, request: Request, why: str) -> Response:
    return d.problem(request, 403, "Not allowed", why)


def _scope(request: Request) -> tuple[str | None, str | None]:
    """``(reason, doc_id)`` of a replay page: a reason group (``all``: every one) or a job."""
    params = request.query_params
    return params.get("reason") or None, params.get("doc") or None


def _jobs_of(
    d: Dashboard, sub: Subscription, reason: str | None, doc: str | None
) -> list[FailedJob]:
    if doc is not None:
        return d.jobs.by_ids(sub, [doc]) if is_doc_id(doc) else []
    return d.jobs.failed(sub, None if reason == "all" else reason)


def replay_preview(d: Dashboard, request: Request) -> Response:
    """The dry run of a replay, and the form that confirms it."""
    if not d.guard.allow_actions:
        return _forbidden(
            d, request, "read-only: this dashboard was started without --allow-actions"
        )
    sub = d.subscription(request)
    reason, doc = _scope(request)
    if sub is None or (doc is None and reason not in (*FAILURE_REASONS, "all")):
        return d.problem(request, 400, "Nothing to replay", "give a reason group or a job")
    jobs = _jobs_of(d, sub, reason, doc)
    total = len(jobs)
    if doc is None:
        total = d.jobs.count_failed(sub, None if reason == "all" else reason)
    results = d.jobs.replay(sub, jobs, dry_run=True)
    ready = [r for r in results if r.kind is ReplayOutcome.DRY_RUN]
    skipped = Counter(r.reason or "" for r in results if r.kind is not ReplayOutcome.DRY_RUN)
    return d.render(
        request,
        "replay_preview.html",
        sub=sub,
        reason=reason,
        doc=doc,
        total=total,
        results=results,
        ready=ready,
        skipped=skipped.most_common(),
        limit=MAX_BULK,
    )


def _first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


async def _form(request: Request) -> dict[str, list[str]]:
    body = await request.body()
    if len(body) > _MAX_FORM_BYTES:
        return {}
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


async def replay_post(d: Dashboard, request: Request) -> Response:
    """Replay the jobs the confirmed dry run listed; log who did it and what happened."""
    form = await _form(request)
    refusal = d.guard.refusal(request, _first(form, "csrf"))
    if refusal is not None:
        _LOGGER.warning("refused a replay by %s: %s", actor(request), refusal)
        return _forbidden(d, request, refusal)
    try:
        sub = d.jobs.subscription((form.get("sub") or [""])[0])
    except KeyError:
        return d.problem(request, 400, "Nothing to replay", "no such subscription")
    ids = [i for i in form.get("ids", []) if is_doc_id(i)][:MAX_BULK]
    who = actor(request)
    what = printable((form.get("scope") or [""])[0], 200)

    def run() -> list[ReplayResult]:
        jobs = d.jobs.by_ids(sub, ids)
        return d.jobs.replay(sub, jobs, dry_run=False, progress=_log_one(who))

    results = await run_in_threadpool(run)
    tally = Counter(r.kind.value for r in results)
    _LOGGER.info(
        "replay by %s of %s on %s: %d job(s) asked, %s",
        who,
        what,
        sub.path,
        len(ids),
        ", ".join(f"{kind} {n}" for kind, n in sorted(tally.items())) or "nothing found",
    )
    return d.render(
        request, "replay_done.html", sub=sub, results=results, tally=tally, asked=len(ids)
    )


def _log_one(who: str) -> Callable[[int, ReplayResult], None]:
    def progress(_index: int, result: ReplayResult) -> None:
        record = result.job.record
        log = job_logger(_LOGGER, result.job.key or "", record.message_id or "")
        log.info("replay by %s: %s", who, result.outcome)

    return progress


def release_confirm(d: Dashboard, request: Request) -> Response:
    """The job as read, what a release does, and the form that confirms it at this epoch."""
    if not d.guard.allow_actions:
        return _forbidden(
            d, request, "read-only: this dashboard was started without --allow-actions"
        )
    doc_id = request.path_params["doc_id"]
    detail = d.jobs.detail(doc_id) if is_doc_id(doc_id) else None
    if detail is None:
        return d.problem(request, 404, "No such job", doc_id[:80])
    if detail.release_refusal is not None:
        return d.problem(request, 409, "Not released", detail.release_refusal)
    return d.render(request, "release_confirm.html", detail=detail, view=detail.view)


async def release_post(d: Dashboard, request: Request) -> Response:
    """``jobs release KEY --epoch N`` for the job and epoch the confirmation showed."""
    form = await _form(request)
    refusal = d.guard.refusal(request, _first(form, "csrf"))
    who = actor(request)
    if refusal is not None:
        _LOGGER.warning("refused a release by %s: %s", who, refusal)
        return _forbidden(d, request, refusal)
    doc_id = request.path_params["doc_id"]
    try:
        epoch = int((form.get("epoch") or [""])[0])
    except ValueError:
        return d.problem(request, 400, "Not released", "the form carries no epoch")
    detail = await run_in_threadpool(d.jobs.detail, doc_id) if is_doc_id(doc_id) else None
    if detail is None or detail.subscription is None or detail.view.key is None:
        return d.problem(request, 404, "No such job", doc_id[:80])
    sub, key = detail.subscription, detail.view.key
    result = await run_in_threadpool(d.jobs.release, sub, key, epoch)
    job_logger(_LOGGER, key, detail.view.message_id or "").info(
        "release by %s at epoch %d: %s%s",
        who,
        epoch,
        result.kind.value,
        f" ({result.detail})" if result.detail else "",
    )
    return d.render(request, "release_done.html", detail=detail, view=detail.view, result=result)


def action_routes(d: Dashboard) -> list[Route]:
    """The routes of the actions (each answers 403 without ``--allow-actions``)."""

    async def replay_endpoint(request: Request) -> Response:
        return await replay_post(d, request)

    async def release_endpoint(request: Request) -> Response:
        return await release_post(d, request)

    return [
        Route("/review/replay", guarded(d, lambda r: replay_preview(d, r)), methods=["GET"]),
        Route("/review/replay", replay_endpoint, methods=["POST"]),
        Route(
            "/jobs/{doc_id}/release",
            guarded(d, lambda r: release_confirm(d, r)),
            methods=["GET"],
        ),
        Route("/jobs/{doc_id}/release", release_endpoint, methods=["POST"]),
    ]
