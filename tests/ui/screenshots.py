"""Screenshots of the dashboard for docs/ui.md: ``python -m tests.ui.screenshots``.

Starts the emulators, creates the attachment worker's topics
(``samples/attachment_worker/topology.toml``), seeds the showcase jobs
(:mod:`tests.ui.seed`), serves the dashboard with ``--allow-actions`` and
saves a PNG of each page into ``docs/images/`` (``--out`` to change), taken by
Debian's chromium through Playwright.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from google.cloud import firestore

import pubsub_worker
from benchmarks.ui_support import serving
from emulator import load_topology, start_emulators
from pubsub_worker.ui import Jobs, create_app
from tests.ui.conftest import CHROMIUM, launch
from tests.ui.seed import seed_showcase

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "attachment-demo"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ui.screenshots", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with start_emulators(PROJECT) as emu:
        emu.export_env()
        made = emu.bootstrap(load_topology(ROOT / "samples/attachment_worker/topology.toml"))
        subscription = made.subscriptions["attachments-worker"]
        client = firestore.Client(project=PROJECT)
        ids = seed_showcase(client, "attachment_jobs", subscription)
        settings = pubsub_worker.Settings(
            subscription=subscription, collection="attachment_jobs", key_attribute="operation_id"
        )
        jobs = Jobs(settings, client=client)
        sub = quote(subscription, safe="")
        shots = {
            "ui-overview.png": "/",
            "ui-jobs.png": f"/jobs?sub={sub}",
            "ui-job.png": f"/jobs/{ids['op-2017']}",
            "ui-review.png": f"/review?sub={sub}",
            "ui-replay-preview.png": f"/review/replay?sub={sub}&reason=attempts",
        }
        with serving(create_app(jobs, allow_actions=True)) as url, sync_playwright() as pw:
            browser = launch(pw, CHROMIUM)
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            for name, path in shots.items():
                page.goto(url + path)
                page.wait_for_load_state("networkidle")
                # The job list is long: its first screen shows what it is.
                page.screenshot(path=str(args.out / name), full_page=name != "ui-jobs.png")
                print(f"saved {args.out / name}")
            browser.close()
        jobs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
