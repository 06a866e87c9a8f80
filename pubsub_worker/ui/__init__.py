"""``pubsub-worker ui``: the jobs dashboard (``pip install 'pubsub-worker[ui]'``).

What is running, stuck and waiting for review, across the shards of one or
more subscriptions, read from the same job documents with the same settings
as ``pubsub-worker jobs``; with ``--allow-actions``, release and replay
through the same code, each previewed by a dry run and confirmed. Pages are
rendered on the server (Starlette, Jinja2); htmx, vendored, refreshes the live
parts. See ``docs/ui.md``.

* :mod:`.app`: the application (routes, middleware); :mod:`.pages`: the read pages;
* :mod:`.actions`: release and replay (asked, previewed, confirmed, logged);
* :mod:`.jobs`: the one door to the jobs, through :mod:`pubsub_worker._ops`;
* :mod:`.filters`: the job list's filters; :mod:`.format`: how values show;
* :mod:`.security`: read-only mode, CSRF, hosts, headers, who acted.
"""

from __future__ import annotations

from .app import create_app
from .jobs import Jobs
from .pages import Dashboard

__all__ = ["Dashboard", "Jobs", "create_app"]
