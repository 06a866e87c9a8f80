"""Replay from the review queue, in headless Chromium, and the job runs again on a real worker.

A real worker on the emulators sends a job to the failure path (its second
step raises ``PermanentError``); the cause is fixed; in the browser the
review queue's group asks (its replay button leads to a dry run, which writes
nothing), previews (how many would be replayed) and, confirmed, replays. The
worker then runs the job again: its first step is skipped (recorded), its
second runs once. The action is logged with who did it and the job's key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

import pubsub_worker
from emulator import SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker._job.keys import document_id
from pubsub_worker._ops import replay_route
from pubsub_worker.ui import Jobs, create_app
from tests.support.observe import end_stale_streams

pytestmark = pytest.mark.emulator


def test_the_review_queue_asks_previews_and_replays_and_the_job_runs_again(
    page: Any,
    serve: Callable[[Any], AbstractContextManager[str]],
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    settings_for: Callable[..., pubsub_worker.Settings],
    worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    review = make_subscription(exactly_once=False)
    settings = settings_for(eod_subscription, key_attribute="op", failure_topic=review.topic_path)
    effects: list[tuple[str, str]] = []
    broken = {"b": True}

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        def a() -> str:
            effects.append(("a", job.key))
            return "a-done"

        def b() -> str:
            if broken["b"]:
                raise pubsub_worker.PermanentError("downstream rejected the document")
            effects.append(("b", job.key))
            return "b-done"

        job.step("a", a)
        job.step("b", b)

    with worker(handle, settings) as w:
        publisher.publish(eod_subscription.topic_path, b"doc", op="claim-7").result()
        w.wait_for(lambda: w.counter(Counter.FAILED) == 1)
    assert effects == [("a", "claim-7")]
    document = firestore_client.collection(settings.collection).document(
        document_id(settings.subscription_path, "claim-7")
    )
    assert document.get().to_dict()["status"] == "failed"

    broken["b"] = False  # the reviewer fixed the cause
    end_stale_streams(subscriber, eod_subscription.subscription_path)
    # Its replay topic (`pubsub-worker jobs replay-setup`): the next worker consumes it.
    replay_route.setup(settings, subscriber=subscriber, publisher=publisher)
    caplog.set_level(logging.INFO, logger="pubsub_worker.ui")
    source = Jobs(settings, client=firestore_client)
    app = create_app(source, allow_actions=True)
    try:
        with worker(handle, settings) as w, serve(app) as url:
            page.goto(url + "/review")
            group = page.locator('[data-reason="permanent"]')
            assert group.locator(".count").inner_text() == "1"
            assert "downstream rejected the document" in group.inner_text()
            group.locator("text=Replay 1…").click()

            # It asks: a dry run, nothing written or published.
            assert page.locator("[data-ready]").get_attribute("data-ready") == "1"
            assert "1 would be replayed" in page.locator("[data-preview]").inner_text()
            assert "claim-7" in page.locator("main").inner_text()
            stored = document.get().to_dict()
            assert (stored["status"], stored["epoch"]) == ("failed", 1)

            page.click("[data-confirm-replay]")
            assert "1 of 1 job replayed" in page.locator("[data-done]").inner_text()
            w.wait_for(lambda: w.counter(Counter.COMPLETED) == 1, timeout_s=60)
    finally:
        source.close()
    assert effects == [("a", "claim-7"), ("b", "claim-7")]  # step a was not repeated
    stored = document.get().to_dict()
    assert (stored["status"], stored["epoch"]) == ("completed", 3)  # replay 2, claim 3

    source = Jobs(settings, client=firestore_client)
    with serve(create_app(source)) as url:
        page.goto(url + "/review")
        assert "No failed job" in page.locator("main").inner_text()
        page.goto(f"{url}/jobs/{document.id}")
        assert page.locator("[data-status]").inner_text() == "completed"
        assert page.locator("[data-epoch]").inner_text() == "3"
    source.close()

    logged = [
        r
        for r in caplog.records
        if r.getMessage().endswith("replay by anonymous from 127.0.0.1: replayed")
    ]
    assert [r.job_key for r in logged] == ["claim-7"]  # type: ignore[attr-defined]
    (summary,) = [
        r for r in caplog.records if "of failed jobs of reason permanent" in r.getMessage()
    ]
    assert "1 job(s) asked, replayed 1" in summary.getMessage()
