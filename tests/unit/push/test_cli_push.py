"""``pubsub-worker push``: a bad or missing setting is one line and exit 2, before any I/O."""

from __future__ import annotations

import os

from pubsub_worker.cli import build_parser
from tests.support.processes import run_cli

BASE = {
    "PATH": os.environ.get("PATH", ""),
    "PUBSUB_WORKER_SUBSCRIPTION": "projects/p/subscriptions/orders-push",
    # Unreachable on purpose: a configuration error must come before any connection.
    "PUBSUB_EMULATOR_HOST": "127.0.0.1:9",
    "FIRESTORE_EMULATOR_HOST": "127.0.0.1:9",
}


def test_token_settings_missing_is_one_line_and_exit_2() -> None:
    done = run_cli(BASE, "push", "samples.cloud_run.handler:handle", "--port", "0")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("pubsub-worker: PUBSUB_WORKER_PUSH_AUDIENCE and ")
    assert "Traceback" not in done.stderr


def test_a_bad_push_setting_names_its_variable() -> None:
    env = {**BASE, "PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT": "nobody"}
    done = run_cli(env, "push", "samples.cloud_run.handler:handle")
    assert done.returncode == 2
    assert "PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT='nobody'" in done.stderr


def test_verification_off_off_the_emulators_is_one_line_and_exit_2() -> None:
    env = {
        **{k: v for k, v in BASE.items() if not k.endswith("_EMULATOR_HOST")},
        "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false",
    }
    done = run_cli(env, "push", "samples.cloud_run.handler:handle", "--port", "0")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pubsub-worker: PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false is accepted only")
    assert "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED=true" in last
    assert "Traceback" not in done.stderr


def test_an_unknown_handler_is_one_line_and_exit_2() -> None:
    env = {**BASE, "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false"}
    done = run_cli(env, "push", "nowhere.module:handle")
    assert done.returncode == 2
    assert "cannot import 'nowhere.module'" in done.stderr


def test_the_port_defaults_to_cloud_runs() -> None:
    args = build_parser().parse_args(["push", "m:h"])
    assert (args.host, args.metrics_port) == ("0.0.0.0", None)
    assert args.port == int(os.environ.get("PORT", "8080"))
