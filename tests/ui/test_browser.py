"""The dashboard in headless Chromium, on the Firestore emulator, with seeded jobs.

Each page renders what was written; the job list's filters and paging work
as a person uses them (the form, the search box, the "More" button that htmx
appends with); the running jobs refresh by themselves; read-only mode offers
no action and refuses a forged POST; with actions, a release is asked,
confirmed and fenced, and a POST without the page's token is refused.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from benchmarks.ui_support import Job, job_document, write_documents
from pubsub_worker.stores.base import Status
from pubsub_worker.ui import Jobs, create_app

from .seed import FAILED, RUNNING, SHOWCASE_COUNTS, SHOWCASE_SUB, showcase_jobs

pytestmark = pytest.mark.emulator

Serve = Callable[[Any], AbstractContextManager[str]]


def _keys(page: Any) -> list[str]:
    return [text.strip() for text in page.locator("#rows td.key").all_inner_texts()]


def test_each_page_renders_and_the_filters_and_paging_work(
    page: Any, serve: Serve, showcase: tuple[Jobs, dict[str, str]], firestore_client: Any
) -> None:
    source, _ = showcase
    jobs = sorted(showcase_jobs(datetime.now(timezone.utc)), key=lambda j: j.updated_at)
    newest_first = [job.key for job in reversed(jobs)]
    with serve(create_app(source)) as url:
        page.goto(url)
        assert page.title() == "Overview · pubsub-worker"
        for status, count in SHOWCASE_COUNTS.items():
            assert page.locator(f'[data-count="{status.value}"]').inner_text() == str(count)
        assert page.locator('[data-count="review"]').inner_text() == str(len(FAILED))
        running = page.locator("#running-0")
        assert sorted(running.locator("td.key").all_inner_texts()) == sorted(RUNNING)
        assert "op-2018" in page.locator("#failures-0").inner_text()
        assert "op-2014" in page.locator(".facts").inner_text()  # the oldest running

        # The running jobs refresh by themselves (htmx, every 5 s): a job claimed now shows up.
        fresh = Job("op-2019", Status.RUNNING, datetime.now(timezone.utc), [("parse", 90)])
        write_documents(firestore_client, source.collection, [job_document(SHOWCASE_SUB, fresh)])
        running.locator("text=op-2019").wait_for(timeout=12_000)

        # The job list: 50 rows a page, newest first; "More" appends the next page in place.
        newest_first.insert(0, "op-2019")
        page.click("nav >> text=Jobs")
        assert _keys(page) == newest_first[:50]
        page.click("text=More →")
        page.locator("#rows tr:nth-child(100)").wait_for()
        assert page.url.endswith("/jobs")  # appended, not navigated
        assert _keys(page)[:100] == newest_first[:100]
        page.click("text=More →")
        page.locator(f"#rows td.key >> text={newest_first[-1]}").wait_for()
        assert _keys(page) == newest_first
        assert page.locator("text=More →").count() == 0

        # Status through the form; a key prefix through the search box.
        page.select_option("select[name=status]", "failed")
        page.click("form.filters button")
        assert _keys(page) == [k for k in newest_first if k in FAILED]
        page.fill("header .find input", "op-201")
        page.press("header .find input", "Enter")
        assert _keys(page) == [k for k in newest_first if k.startswith("op-201")]
        # A last-write range: the jobs written days ago only.
        day_ago = datetime.now(timezone.utc) - timedelta(days=1)
        page.goto(f"{url}/jobs?until=" + day_ago.strftime("%Y-%m-%dT%H:%M:%S"))
        assert sorted(_keys(page)) == sorted(k for k in newest_first if k.startswith("op-1"))[:50]
        page.goto(f"{url}/jobs?since=someday")
        assert "since='someday': expected a UTC time" in page.locator("[role=alert]").inner_text()

        # One job's whole story.
        page.goto(f"{url}/jobs?status=failed")
        page.click("text=op-2017")
        assert page.locator("[data-status]").inner_text() == "failed"
        text = page.locator("main").inner_text()
        for fact in (
            "attempts",
            "OSError: [Errno 28] No space left on device",
            "parse",
            "transcode",
            "not sent",
            "op-2017:transcode:0",
            "claims-portal",
            "sent: the failure message is published",
        ):
            assert fact in text, fact

        # The review queue: groups by reason with their counts, and no action offered.
        page.click("nav >> text=Review queue")
        groups = {
            reason: page.locator(f'[data-reason="{reason}"] .count').inner_text()
            for reason in ("attempts", "permanent", "too_large")
        }
        assert groups == {"attempts": "2", "permanent": "1", "too_large": "1"}


def test_read_only_offers_no_action_and_refuses_a_forged_post(
    page: Any, serve: Serve, showcase: tuple[Jobs, dict[str, str]], firestore_client: Any
) -> None:
    source, ids = showcase
    before = firestore_client.collection(source.collection).document(ids["op-2016"]).get()
    with serve(create_app(source)) as url:
        for path in ("/", "/jobs", f"/jobs/{ids['op-2016']}", f"/jobs/{ids['op-2013']}", "/review"):
            page.goto(url + path)
            assert page.locator(".mode").inner_text() == "read-only"
            assert page.locator("form[method=post]").count() == 0
            offered = page.locator("a.button, button", has_text=re.compile("Replay|Release"))
            assert offered.count() == 0
        for path in ("/review/replay?reason=attempts", f"/jobs/{ids['op-2013']}/release"):
            assert page.goto(url + path).status == 403
        forged = page.request.post(
            url + "/review/replay",
            form={"csrf": "0" * 64, "sub": SHOWCASE_SUB, "ids": ids["op-2016"], "scope": "forged"},
        )
        assert forged.status == 403
        assert "started without --allow-actions" in forged.text()
        release = page.request.post(url + f"/jobs/{ids['op-2013']}/release", form={"epoch": "1"})
        assert release.status == 403
    after = firestore_client.collection(source.collection).document(ids["op-2016"]).get()
    assert after.update_time == before.update_time  # nothing was written


def test_a_release_is_asked_confirmed_at_the_epoch_shown_and_logged(
    page: Any,
    serve: Serve,
    showcase: tuple[Jobs, dict[str, str]],
    firestore_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, ids = showcase
    document = firestore_client.collection(source.collection).document(ids["op-2013"])
    caplog.set_level(logging.INFO, logger="pubsub_worker.ui")
    with serve(create_app(source, allow_actions=True)) as url:
        page.goto(f"{url}/jobs/{ids['op-2013']}")
        assert page.locator(".mode").inner_text() == "actions enabled"
        # A forged POST without the page's token changes nothing.
        forged = page.request.post(url + f"/jobs/{ids['op-2013']}/release", form={"epoch": "1"})
        assert forged.status == 403
        assert "no CSRF token" in forged.text()
        assert document.get().to_dict()["epoch"] == 1

        page.click("text=Release…")
        assert "epoch 1 → 2" in page.locator("main").inner_text()
        assert document.get().to_dict()["status"] == "running"  # asking wrote nothing
        page.click("text=Release at epoch 1")
        assert page.locator("[data-release]").get_attribute("data-release") == "released"
    stored = document.get().to_dict()
    assert (stored["status"], stored["epoch"]) == ("released", 2)
    (logged,) = [
        r for r in caplog.records if "release by" in r.getMessage() and r.levelno == logging.INFO
    ]
    assert "release by anonymous from 127.0.0.1 at epoch 1: released" in logged.getMessage()
    assert logged.job_key == "op-2013"  # type: ignore[attr-defined]
