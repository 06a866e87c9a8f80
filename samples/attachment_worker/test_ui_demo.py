"""The dashboard beside the demo's worker: what a user does after ``nox -s ui-demo``.

The demo runs and keeps its worker and emulators; ``pubsub-worker ui
--allow-actions`` started with the printed variables shows the demo's jobs;
the malformed attachment is replayed from the review queue (the dry run, then
the confirmed POST with the page's token) and the worker runs it again: a new
epoch, back in review (it is still malformed). Both processes stop on SIGINT.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.emulator


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _exports(process: subprocess.Popen[str], timeout_s: float = 240) -> dict[str, str]:
    """The ``export`` lines the demo prints once its worker runs again."""
    assert process.stdout is not None
    variables: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    for line in process.stdout:
        if line.strip().startswith("export "):
            name, _, value = line.strip().removeprefix("export ").partition("=")
            variables[name] = shlex.split(value)[0] if value else ""
        if "pubsub-worker ui --allow-actions" in line:
            return variables
        assert time.monotonic() < deadline, "the demo did not get to its export lines"
    raise AssertionError(f"the demo ended early (exit {process.wait()})")


def _stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode


def _get(http: httpx.Client, path: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return http.get(path)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the dashboard did not answer"
            time.sleep(0.3)


def test_a_failed_demo_job_is_replayed_from_the_dashboard_and_runs_again() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "samples.attachment_worker.ui_demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ui = None
    try:
        variables = _exports(demo)
        port = _free_port()
        command = ["-m", "pubsub_worker.cli", "ui", "--allow-actions", "--port", str(port)]
        ui = subprocess.Popen(
            [sys.executable, *command],
            env={**os.environ, **variables},
            stderr=subprocess.PIPE,
            text=True,
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            overview = _get(http, "/")
            # The counts follow the page in their own request, as the browser's htmx fetches them.
            part = re.findall(r'hx-get="(/parts/counts\?[^"]+)" hx-trigger="load"', overview.text)
            assert len(part) == 1, overview.text
            counts = http.get(html.unescape(part[0])).text
            assert re.search(r'data-count="completed">5<', counts)
            assert re.search(r'data-count="failed">1<', counts)
            review = http.get("/review")
            assert "op-1006" in review.text
            assert "attachment content is not base64" in review.text
            preview = http.get("/review/replay?reason=permanent")
            assert 'data-ready="1"' in preview.text
            form = {
                "csrf": re.findall(r'name="csrf" value="([^"]+)"', preview.text)[0],
                "sub": variables["PUBSUB_WORKER_SUBSCRIPTION"],
                "ids": re.findall(r'name="ids" value="([0-9a-f]{64})"', preview.text),
                "scope": "the demo's review queue",
            }
            done = http.post("/review/replay", data=form)
            assert "1 of 1 job replayed" in done.text
            job = f"/jobs/{form['ids'][0]}"
            deadline = time.monotonic() + 60
            while "data-epoch>3<" not in http.get(job).text:  # replay 2, the worker's claim 3
                assert time.monotonic() < deadline, "the worker did not run the replayed job"
                time.sleep(0.5)
            page = http.get(job).text
            assert "data-status>failed<" in page  # still malformed: back in review
            assert "Replayed" in page
    finally:
        if ui is not None:
            assert _stop(ui) == 0
        assert _stop(demo) == 0
