"""The ``pubsub-worker`` command as an operator and a script meet it, against the real emulators.

Every test runs the real command in a child process and checks its exit code
and output: ``--subscription``/``--project``, ``--output json``, ``jobs stats``,
unknown keys, a rich table and progress bar on a terminal (a pseudo-terminal)
and plain text when piped, a pipe closed early, and each metric's help text on
``/metrics``. Job documents are written as workers leave them
(:func:`tests.support.job_documents.put_job`).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.error
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from emulator import Emulators, SubscriptionHandle
from pubsub_worker import Counter
from pubsub_worker.stores import FirestoreJobStore
from pubsub_worker.stores.base import JobRecord, Review, Status
from tests.integration.test_serve import HOST, free_port, get, wait_for
from tests.support.job_documents import job_document, put_job
from tests.support.processes import ROOT, run_cli

pytestmark = pytest.mark.emulator

ESCAPE = "\x1b["


@pytest.fixture
def cli_env(
    emulators: Emulators, eod_subscription: SubscriptionHandle, firestore_collection: str
) -> dict[str, str]:
    """An operator's shell: the emulators, the subscription and collection of this test."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PUBSUB_WORKER_") and k not in ("NO_COLOR", "FORCE_COLOR")
    }
    env.update(
        emulators.env(),
        PUBSUB_WORKER_SUBSCRIPTION=eod_subscription.subscription_path,
        PUBSUB_WORKER_COLLECTION=firestore_collection,
    )
    made = run_cli(env, "jobs", "replay-setup")  # replays reach this subscription alone
    assert made.returncode == 0, made.stderr
    return env


@pytest.fixture
def store(firestore_client: Any, firestore_collection: str) -> FirestoreJobStore:
    return FirestoreJobStore(firestore_client, firestore_collection)


def replay_topic_of(handle: SubscriptionHandle) -> str:
    """The replay topic of the subscription: named after the subscription, not its topic."""
    return handle.subscription_path.replace("/subscriptions/", "/topics/") + "-replay"


def run_on_terminal(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """The command with a pseudo-terminal (160 columns) as stdin, stdout and stderr."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "pubsub_worker.cli", *argv],
        cwd=ROOT,
        env={**env, "TERM": "xterm-256color"},
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = process.wait(timeout=30)
    finally:
        os.close(primary)
    return code, b"".join(chunks).decode("utf-8", "replace")


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_subscription_and_project_flags_look_at_another_subscription(
    cli_env: dict[str, str],
    emulators: Emulators,
    make_subscription: Any,
    eod_subscription: SubscriptionHandle,
    store: FirestoreJobStore,
) -> None:
    other = make_subscription(exactly_once=True)
    other_id = other.subscription_path.rsplit("/", 1)[1]
    put_job(store, eod_subscription.subscription_path, "mine", Status.RUNNING)
    put_job(store, other.subscription_path, "theirs-1", Status.FAILED)
    put_job(store, other.subscription_path, "theirs-2", Status.COMPLETED)

    # The environment names this test's subscription; the flags name the other one.
    flags = ("--subscription", other_id, "--project", emulators.project)
    listed = run_cli(cli_env, "jobs", "list", *flags, "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(job["key"] for job in json.loads(listed.stdout)["jobs"]) == [
        "theirs-1",
        "theirs-2",
    ]
    shown = run_cli(cli_env, "jobs", "show", "theirs-1", "--subscription", other.subscription_path)
    assert shown.returncode == 0, shown.stderr
    assert "status       failed (epoch 1, attempts 1)" in shown.stdout
    mine = run_cli(cli_env, "jobs", "show", "mine", *flags)
    assert mine.returncode == 4
    assert one_line(mine.stderr) == f"pubsub-worker: no job mine on {other.subscription_path}"

    config = run_cli(cli_env, "config", *flags, "--output", "json")
    rows = {row["variable"]: row for row in json.loads(config.stdout)["settings"]}
    assert rows["PUBSUB_WORKER_SUBSCRIPTION"] == {
        "variable": "PUBSUB_WORKER_SUBSCRIPTION",
        "value": other_id,
        "source": "--subscription",
    }
    assert rows["subscription path"]["value"] == other.subscription_path


def test_jobs_stats_counts_by_status_names_the_oldest_running_job_and_pending_reviews(
    cli_env: dict[str, str], eod_subscription: SubscriptionHandle, store: FirestoreJobStore
) -> None:
    sub = eod_subscription.subscription_path
    now = datetime.now(timezone.utc)
    put_job(store, sub, "stuck", Status.RUNNING, updated_at=now - timedelta(minutes=20))
    put_job(store, sub, "busy", Status.RUNNING, updated_at=now - timedelta(seconds=3))
    for i in range(3):
        put_job(store, sub, f"done-{i}", Status.COMPLETED)
    put_job(store, sub, "bad", Status.FAILED, review=Review.PENDING.value)
    put_job(store, sub, "worse", Status.FAILED, review=Review.SENT.value)

    done = run_cli(cli_env, "jobs", "stats")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:6] == [
        "STATUS     JOBS",
        "running       2",
        "released      0",
        "completed     3",
        "failed        2",
        "total         7",
    ]
    assert re.fullmatch(
        # The lease is judged on Firestore's clock: the document was just written (a 600 s
        # lease, shown rounded: 600 when the command ran within half a second of the write).
        r"oldest running: stuck, last written 1[23]\d\d s ago \(lease (?:5\d\d|600) s left; "
        r"owner host/4242/cafe\)",
        lines[6],
    ), lines[6]
    # Stuck: no write for over a lease (the 20-minute-old one, not the 3-second-old one).
    assert re.fullmatch(
        r"stuck: 1 running job\(s\) with no write for over a lease \(\d+ s\)", lines[7]
    ), lines[7]
    assert lines[8] == (
        "pending reviews: 1 (failure message not published yet), of the 2 failed job(s)"
    )
    assert ESCAPE not in done.stdout

    as_json = run_cli(cli_env, "jobs", "stats", "--output", "json")
    document = json.loads(as_json.stdout)
    assert document["counts"] == {"running": 2, "released": 0, "completed": 3, "failed": 2}
    assert (document["total"], document["reviews_pending"], document["reviews_read"]) == (7, 1, 2)
    assert document["oldest_running"]["key"] == "stuck"
    assert document["subscription"] == sub
    assert document["stuck"] == 1


def test_output_json_is_one_document_for_every_operator_command(
    cli_env: dict[str, str], eod_subscription: SubscriptionHandle, store: FirestoreJobStore
) -> None:
    sub = eod_subscription.subscription_path
    put_job(store, sub, "k1", Status.FAILED)
    put_job(store, sub, "k2", Status.RUNNING, updated_at=datetime(2020, 1, 1, tzinfo=timezone.utc))

    documents = {}
    for argv in (
        ("jobs", "show", "k1"),
        ("jobs", "list"),
        ("jobs", "stats"),
        ("jobs", "replay", "k1", "--dry-run"),
        ("jobs", "release", "k2", "--epoch", "1"),
        ("config",),
    ):
        done = run_cli(cli_env, *argv, "--output", "json")
        assert done.returncode in (0, 1), (argv, done.stderr)  # config: the emulator's hints
        documents[argv[:2]] = json.loads(done.stdout)  # the whole of stdout is the document
    assert documents["jobs", "show"]["status"] == "failed"
    assert {job["key"] for job in documents["jobs", "list"]["jobs"]} == {"k1", "k2"}
    replay_sub = eod_subscription.subscription_path + "-replay"
    replay_topic = replay_topic_of(eod_subscription)
    assert documents["jobs", "replay"] == {
        "topic": replay_topic,
        "reaches": f"to {replay_topic} (reaches only {replay_sub})",
        "dry_run": True,
        "total": 1,
        "replayed": 1,
        "jobs": [
            {
                "key": "k1",
                "document": documents["jobs", "show"]["doc_id"],
                "outcome": "dry-run",
                "reason": None,
            }
        ],
    }
    assert documents["jobs", "release"]["outcome"] == "released"
    assert (
        documents["jobs", "release"]["epoch_before"],
        documents["jobs", "release"]["epoch"],
    ) == (
        1,
        2,
    )
    assert "checks" in documents["config",]


def test_replay_of_an_unknown_key_names_it_replays_nothing_and_exits_4(
    cli_env: dict[str, str], eod_subscription: SubscriptionHandle, store: FirestoreJobStore
) -> None:
    sub = eod_subscription.subscription_path
    doc_id = put_job(store, sub, "k1", Status.FAILED)

    done = run_cli(cli_env, "jobs", "replay", "k1", "nope", "nada")

    assert done.returncode == 4, done.stderr
    assert one_line(done.stderr) == (
        f"pubsub-worker: no job nope, nada on {sub}: nothing was replayed"
    )
    assert done.stdout == ""
    snapshot = store.get(doc_id)
    assert snapshot is not None
    assert JobRecord.parse(snapshot.fields).status is Status.FAILED  # k1 was not replayed

    dry = run_cli(cli_env, "jobs", "replay", "k1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"[1/1] k1: would replay to {replay_topic_of(eod_subscription)}",
        f"would replay 1 of 1 job(s) to {replay_topic_of(eod_subscription)} "
        f"(reaches only {eod_subscription.subscription_path}-replay)",
        "  dry run: nothing was written or published",
    ]


def test_a_terminal_gets_a_rich_table_colours_and_a_progress_bar_a_pipe_plain_text(
    cli_env: dict[str, str], eod_subscription: SubscriptionHandle, store: FirestoreJobStore
) -> None:
    sub = eod_subscription.subscription_path
    keys = [f"order-{i:02}" for i in range(12)]
    for key in keys:
        put_job(store, sub, key, Status.FAILED)
    put_job(store, sub, "busy", Status.RUNNING)

    code, screen = run_on_terminal(cli_env, "jobs", "list")
    assert code == 0, screen
    assert re.search(r"\x1b\[[0-9;]*mfailed", screen), screen  # the status in its colour
    assert re.search(r"\x1b\[[0-9;]*mrunning", screen), screen
    assert "13 job(s) on" in screen

    piped = run_cli(cli_env, "jobs", "list")
    assert piped.returncode == 0, piped.stderr
    assert ESCAPE not in piped.stdout
    header, *rows, summary = piped.stdout.splitlines()
    assert header.split() == [
        "KEY",
        "STATUS",
        "EPOCH",
        "ATTEMPTS",
        "UPDATED",
        "LEASE",
        "STEPS",
        "ERROR",
    ]
    assert rows[0].split()[:3] == ["busy", "running", "1"]
    assert summary == f"13 job(s) on {sub}, newest first"

    code, screen = run_on_terminal(cli_env, "jobs", "replay", *keys, "busy", "--dry-run")
    assert code == 1, screen  # busy is running: skipped
    assert "replaying" in screen  # rich's bar, drawn on the terminal
    assert "━" in screen
    assert "[1/13]" not in screen  # no line per job replayed: the bar counts them
    assert "[13/13] busy: skipped: running\r\n" in screen  # printed above the bar
    assert re.search(r"\x1b\[[0-9;]*m13/13", screen), screen  # the bar's count, to the end
    assert f"would replay 12 of 13 job(s) to {replay_topic_of(eod_subscription)}" in screen

    piped = run_cli(cli_env, "jobs", "replay", *keys, "--dry-run")
    assert piped.returncode == 0, piped.stderr
    assert ESCAPE not in piped.stdout + piped.stderr
    assert piped.stdout.splitlines()[:12] == [
        f"[{i}/12] {key}: would replay to {replay_topic_of(eod_subscription)}"
        for i, key in enumerate(keys, start=1)
    ]


def test_a_pipe_closed_early_ends_the_command_quietly(
    cli_env: dict[str, str],
    eod_subscription: SubscriptionHandle,
    firestore_client: Any,
    firestore_collection: str,
) -> None:
    jobs = firestore_client.collection(firestore_collection)
    for first in range(0, 800, 400):  # about 100 kB of rows: more than a pipe holds
        batch = firestore_client.batch()
        for i in range(first, first + 400):
            doc_id, fields = job_document(
                eod_subscription.subscription_path, f"job-{i:03}", Status.COMPLETED
            )
            batch.set(jobs.document(doc_id), fields)
        batch.commit()
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m pubsub_worker.cli jobs list --limit 1000 | head -n 2; '
            'echo "exit=${PIPESTATUS[0]}"',
        ],
        cwd=ROOT,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    header, first_row, status = done.stdout.splitlines()
    assert header.split()[:2] == ["KEY", "STATUS"]
    assert first_row.split()[1] == "completed"
    assert status == "exit=141"
    assert done.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"


def test_metrics_each_have_their_own_help_on_the_endpoint(
    cli_env: dict[str, str],
) -> None:
    port = free_port()
    env = {**cli_env, "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "2"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pubsub_worker.cli",
            "run",
            "tests.support.worker:handle_steps",
            "--metrics-port",
            str(port),
            "--metrics-host",
            HOST,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: process.poll() is not None or _serves_metrics(port), 60)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        status, text = get(port, "/metrics")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert (status, process.returncode) == (200, 0)
    helps = {f.name: f.documentation for f in text_string_to_metric_families(text)}
    shown = [helps[f"pubsub_worker_{counter.value}"] for counter in Counter]
    assert shown == [counter.__doc__ for counter in Counter]
    assert len(set(shown)) == len(Counter)


def _serves_metrics(port: int) -> bool:
    try:
        return get(port, "/metrics")[0] == 200
    except urllib.error.URLError:  # not listening yet
        return False
