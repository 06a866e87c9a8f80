"""The dashboard's ASGI application: pages rendered on the server, htmx for the live parts.

=======================  ====================================================
page                     what it shows
=======================  ====================================================
``/``                    per subscription: counts by status, stuck, awaiting
                         review by reason, the oldest running job (refreshed
                         every 30 s), the running jobs (every 5 s), recent
                         failures
``/jobs``                the job list: status, reason, last-write range, key
                         prefix; paged by ``jobs list``'s cursor
``/jobs/{doc_id}``       one job's whole story
``/review``              failed jobs grouped by reason, each group replayable
``/review/replay``       a replay's dry run, then its confirmation (actions)
``/jobs/{id}/release``   a release's confirmation (actions)
``/livez``               ``ok``
=======================  ====================================================

Pages are plain HTML that works without script; htmx (served from
``/static``, no build step) refreshes the live parts and appends the next page
of the job list. Reads run on Starlette's thread pool (the Firestore client
blocks). What keeps it safe is :mod:`pubsub_worker.ui.security`; the actions
are :mod:`pubsub_worker.ui.actions`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pubsub_worker.push.auth import CertificatesUnavailable, Refused

from .actions import action_routes
from .iap import IAP_JWT_HEADER, IapVerifier
from .jobs import Jobs
from .pages import HERE, Dashboard, guarded
from .security import COOKIE, LOOPBACK_HOSTS, Guard, security_headers

__all__ = ["create_app"]

_LOGGER = logging.getLogger("pubsub_worker.ui")


class _Browser(BaseHTTPMiddleware):
    """Gives each browser its CSRF cookie and every answer the security headers; with an IAP
    verifier, refuses every request (but ``/livez``) that IAP did not sign."""

    def __init__(self, app: Any, *, secure: bool, iap: IapVerifier | None) -> None:
        super().__init__(app)
        self.secure = secure
        self.iap = iap

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.user = None
        if self.iap is not None and request.url.path != "/livez":
            assertion = request.headers.get(IAP_JWT_HEADER)
            try:
                request.state.user = await run_in_threadpool(self.iap.user, assertion)
            except Refused as exc:
                _LOGGER.warning("refused a request without IAP's signature: %s", exc.reason)
                return PlainTextResponse(exc.reason, exc.status, headers=security_headers())
            except CertificatesUnavailable as exc:
                return PlainTextResponse(str(exc), 503, headers=security_headers())
        cookie = request.cookies.get(COOKIE)
        request.state.csrf_cookie = cookie or Guard.new_cookie()
        response = await call_next(request)
        if cookie is None:
            response.set_cookie(
                COOKIE,
                request.state.csrf_cookie,
                httponly=True,
                samesite="strict",
                secure=self.secure or request.url.scheme == "https",
            )
        response.headers.update(security_headers())
        return response


def create_app(
    jobs: Jobs,
    *,
    allow_actions: bool = False,
    loopback: bool = True,
    secret: bytes | None = None,
    iap: IapVerifier | None = None,
) -> Starlette:
    """The dashboard over ``jobs``; read-only unless ``allow_actions``.

    ``loopback``: it is served on a loopback address, so only loopback
    ``Host`` headers are answered (no DNS rebinding). ``iap``: every request
    must carry IAP's signed assertion (:mod:`pubsub_worker.ui.iap`).
    """
    dashboard = Dashboard(jobs, Guard(allow_actions=allow_actions, secret=secret))
    pages = {
        "/": dashboard.overview,
        "/parts/counts": dashboard.counts_part,
        "/parts/running": dashboard.running_part,
        "/parts/failures": dashboard.failures_part,
        "/jobs": dashboard.job_list,
        "/jobs/{doc_id}": dashboard.job,
        "/review": dashboard.review,
    }
    routes = [
        *(Route(path, guarded(dashboard, handler)) for path, handler in pages.items()),
        *action_routes(dashboard),
        Route("/livez", lambda _request: PlainTextResponse("ok")),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(_Browser, secure=not loopback, iap=iap)]
    if loopback:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS)))
    app = Starlette(routes=routes, middleware=middleware)
    app.state.dashboard = dashboard
    return app
