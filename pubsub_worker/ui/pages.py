"""The dashboard's read pages: overview, job list, one job, review queue; and how any renders.

:class:`Dashboard` renders the Jinja2 templates (autoescaped) with what every
page shows (the subscriptions, the mode, the CSRF token of the browser), and
answers each read page from :class:`~pubsub_worker.ui.jobs.Jobs`. A store
error becomes a page that says so (:func:`guarded`), never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from pubsub_worker.errors import PubSubWorkerError
from pubsub_worker.stores.base import Status
from pubsub_worker.stores.layout import IndexMissing

from . import format as fmt
from .filters import BadFilter, Filters
from .jobs import RECENT, Jobs, Subscription
from .security import Guard

__all__ = ["REASONS", "Dashboard", "guarded", "is_doc_id"]

HERE = Path(__file__).parent
_DOC_ID_LENGTH = 64
REASONS = {
    "attempts": "failed MAX_ATTEMPTS times",
    "permanent": "the handler raised PermanentError",
    "too_large": "a step's result or an outbox entry would not fit in the job document",
    "limits": "a message it would publish breaks Pub/Sub's limits",
    "missing_key": "no key attribute: rejected before it became a job (fix and republish)",
    "payload_conflict": "its key was used before with another payload (fix and republish)",
    "error": "failed without a named reason",
}
"""What each failure reason means, as the review queue says it."""


class Dashboard:
    """The pages, their templates and the guard of the actions, over one :class:`Jobs`."""

    def __init__(self, jobs: Jobs, guard: Guard) -> None:
        self.jobs = jobs
        self.guard = guard
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(fmt.FILTERS)

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        cookie = request.state.csrf_cookie
        page = self.env.get_template(name).render(
            request=request,
            allow_actions=self.guard.allow_actions,
            csrf=self.guard.token(cookie),
            subscriptions=self.jobs.subscriptions,
            now=datetime.now(timezone.utc),
            Status=Status,
            **context,
        )
        return HTMLResponse(page, status_code=status_code)

    def problem(self, request: Request, status_code: int, title: str, detail: str) -> Response:
        return self.render(request, "problem.html", status_code, title=title, detail=detail)

    def subscription(self, request: Request) -> Subscription | None:
        try:
            return self.jobs.subscription(request.query_params.get("sub") or None)
        except KeyError:
            return None

    # -- pages --------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        # The counts follow in their own request (``counts_part``): the page answers at once.
        cards = [
            (
                sub,
                None,
                self.jobs.latest(sub, Status.RUNNING, 20),
                self.jobs.latest(sub, Status.FAILED, RECENT),
            )
            for sub in self.jobs.subscriptions
        ]
        return self.render(request, "overview.html", cards=cards)

    def counts_part(self, request: Request) -> Response:
        sub = self.subscription(request)
        if sub is None:
            return self.problem(request, 404, "No such subscription", "")
        return self.render(request, "_counts.html", sub=sub, counts=self.jobs.counts(sub))

    def running_part(self, request: Request) -> Response:
        sub = self.subscription(request)
        if sub is None:
            return self.problem(request, 404, "No such subscription", "")
        page = self.jobs.latest(sub, Status.RUNNING, 20)
        return self.render(request, "_running.html", sub=sub, page=page)

    def failures_part(self, request: Request) -> Response:
        sub = self.subscription(request)
        if sub is None:
            return self.problem(request, 404, "No such subscription", "")
        page = self.jobs.latest(sub, Status.FAILED, RECENT)
        return self.render(request, "_failures.html", sub=sub, page=page)

    def job_list(self, request: Request) -> Response:
        sub = self.subscription(request)
        if sub is None:
            return self.problem(request, 404, "No such subscription", "")
        try:
            filters = Filters.from_query(request.query_params)
        except BadFilter as exc:
            return self.render(
                request, "jobs.html", 400, sub=sub, filters=Filters(), page=None, error=str(exc)
            )
        page = self.jobs.page(sub, filters)
        rows_only = request.headers.get("hx-request") and request.query_params.get("part")
        name = "_rows.html" if rows_only else "jobs.html"
        return self.render(request, name, sub=sub, filters=filters, page=page, error=None)

    def job(self, request: Request) -> Response:
        doc_id = request.path_params["doc_id"]
        detail = self.jobs.detail(doc_id) if is_doc_id(doc_id) else None
        if detail is None:
            return self.problem(request, 404, "No such job", f"no job document {doc_id[:80]}")
        return self.render(request, "job.html", detail=detail, view=detail.view)

    def review(self, request: Request) -> Response:
        sub = self.subscription(request)
        if sub is None:
            return self.problem(request, 404, "No such subscription", "")
        review = self.jobs.review(sub)
        return self.render(request, "review.html", sub=sub, review=review, REASONS=REASONS)


def is_doc_id(text: str) -> bool:
    return len(text) == _DOC_ID_LENGTH and all(c in "0123456789abcdef" for c in text)


def guarded(
    dashboard: Dashboard, handler: Callable[[Request], Response]
) -> Callable[[Request], Response]:
    """``handler``, with the store's errors shown as a page instead of a traceback."""

    def page(request: Request) -> Response:
        try:
            return handler(request)
        except IndexMissing as exc:
            return dashboard.problem(request, 503, "Firestore needs an index", str(exc))
        except PubSubWorkerError as exc:
            return dashboard.problem(request, 503, "The dashboard cannot answer", str(exc))

    return page
