"""The dashboard over HTTP, served by uvicorn on the emulator: what no browser page shows.

Hosts other than loopback are refused when bound to loopback (DNS
rebinding); every answer carries the security headers; a POST from another
site is refused even with the browser's own cookie and token; ``pubsub-worker
ui`` itself starts from the environment, serves, and stops on SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from pubsub_worker.ui import Jobs, create_app

from .seed import SHOWCASE_SUB

pytestmark = pytest.mark.emulator

Serve = Callable[[Any], AbstractContextManager[str]]


def test_bound_to_loopback_it_answers_loopback_hosts_only_with_its_headers(
    serve: Serve, showcase: tuple[Jobs, dict[str, str]]
) -> None:
    jobs, _ = showcase
    with serve(create_app(jobs)) as url, httpx.Client(base_url=url, timeout=60) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["x-frame-options"] == "DENY"
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert "Secure" not in cookie  # plain http on loopback
        assert http.get("/", headers={"host": "localhost:1"}).status_code == 200
        rebound = http.get("/", headers={"host": "evil.example"})
        assert rebound.status_code == 400
        assert http.get("/static/htmx.min.js").text.startswith("var htmx=")
        assert http.get("/livez").text == "ok"
        assert http.get("/jobs/" + "0" * 64).status_code == 404


def test_behind_a_proxy_it_answers_any_host_with_a_secure_cookie(
    serve: Serve, showcase: tuple[Jobs, dict[str, str]]
) -> None:
    jobs, _ = showcase
    with (
        serve(create_app(jobs, loopback=False)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        page = http.get("/", headers={"host": "jobs.example.run.app"})
        assert page.status_code == 200
        assert "Secure" in page.headers["set-cookie"]


def test_a_post_from_another_site_is_refused_with_the_browser_s_own_token(
    serve: Serve, showcase: tuple[Jobs, dict[str, str]], firestore_client: Any
) -> None:
    jobs, ids = showcase
    doc = firestore_client.collection(jobs.collection).document(ids["op-2013"])
    with (
        serve(create_app(jobs, allow_actions=True)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        confirm = http.get(f"/jobs/{ids['op-2013']}/release")
        match = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm.text)
        assert match is not None
        form = {"csrf": match.group(1), "epoch": "1"}
        other = http.post(
            f"/jobs/{ids['op-2013']}/release", data=form, headers={"origin": "https://evil.example"}
        )
        assert other.status_code == 403
        assert "another site" in other.text
        assert doc.get().to_dict()["epoch"] == 1
        same = http.post(f"/jobs/{ids['op-2013']}/release", data=form, headers={"origin": url})
        assert same.status_code == 200
        assert doc.get().to_dict()["epoch"] == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_command_serves_from_the_environment_and_stops_on_sigint(
    emulators: Any, showcase: tuple[Jobs, dict[str, str]]
) -> None:
    jobs, _ = showcase
    port = _free_port()
    env = {
        **os.environ,
        **emulators.env(),
        "PUBSUB_WORKER_SUBSCRIPTION": SHOWCASE_SUB,
        "PUBSUB_WORKER_COLLECTION": jobs.collection,
    }
    command = [sys.executable, "-m", "pubsub_worker.cli", "ui", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                overview = httpx.get(f"http://127.0.0.1:{port}/", timeout=60)
                break
            except httpx.TransportError:
                assert process.poll() is None, "the dashboard exited"
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.2)
        assert overview.status_code == 200
        assert "ui-attachments" in overview.text
        assert "read-only" in overview.text
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert f"jobs dashboard on http://127.0.0.1:{port} (read-only) for {SHOWCASE_SUB}" in err


def test_the_command_says_in_one_line_when_firestore_does_not_answer(emulators: Any) -> None:
    env = {
        **os.environ,
        **emulators.env(),
        "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{_free_port()}",
        "PUBSUB_WORKER_SUBSCRIPTION": SHOWCASE_SUB,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pubsub_worker.cli", "ui", "--port", str(_free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3  # unreachable (the command's exit codes)
    assert done.stderr.startswith("pubsub-worker: Firestore did not answer")
    assert "Traceback" not in done.stderr
