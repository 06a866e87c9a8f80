"""The dashboard in a real browser: Debian's chromium, driven by Playwright, never downloaded.

``browser`` launches ``/usr/bin/chromium`` headless (Playwright's own browser
builds are never fetched). When it is absent the browser tests are skipped
with the reason, except under ``CI``, where they fail: ``.ci/run`` installs
it. ``serve`` runs a dashboard under uvicorn on a free loopback port;
``showcase`` seeds the jobs of :mod:`tests.ui.seed`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

import pubsub_worker
from benchmarks.ui_support import serving
from emulator.pytest_plugin import running_in_ci
from pubsub_worker.ui import Jobs
from tests.integration.conftest import settings_for, worker  # noqa: F401 - real workers

from .seed import SHOWCASE_SUB, seed_showcase

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_or_skip() -> str:
    """The path of Debian's chromium; skip (fail under CI) when it is not installed."""
    path = shutil.which(CHROMIUM) or shutil.which("chromium")
    if path is None:
        message = f"{CHROMIUM} is not installed (apt-get install chromium); .ci/run installs it"
        if running_in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def launch(playwright: Any, executable: str) -> Any:
    """A headless chromium (the given binary) through Playwright."""
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless chromium for the session."""
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright, executable)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) and page; 15 s for any wait."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def showcase(
    emulators: Any, firestore_client: Any, firestore_collection: str
) -> Iterator[tuple[Jobs, dict[str, str]]]:
    """The showcase jobs (:mod:`tests.ui.seed`) in this test's collection, and a dashboard's
    :class:`~pubsub_worker.ui.Jobs` over them; their document ids by key."""
    ids = seed_showcase(firestore_client, firestore_collection, SHOWCASE_SUB)
    settings = pubsub_worker.Settings(subscription=SHOWCASE_SUB, collection=firestore_collection)
    jobs = Jobs(settings, client=firestore_client)
    yield jobs, ids
    jobs.close()


@pytest.fixture
def serve() -> Callable[[Any], AbstractContextManager[str]]:
    """``with serve(app) as url:`` the app under uvicorn on a free loopback port."""
    return serving


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that drives the browser with ``browser``."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
