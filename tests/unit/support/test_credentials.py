"""No credentials and no emulator: a clear error saying what to set, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pubsub_worker import ConfigError, Settings
from pubsub_worker._support.clients import firestore_client, publisher_client, subscriber_client
from tests.support.processes import run_cli


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """No emulator host and a credentials file that does not exist."""
    for name in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    missing = str(tmp_path / "missing.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", missing)
    return {"GOOGLE_APPLICATION_CREDENTIALS": missing}


def test_each_client_names_the_service_and_the_emulator_variable(
    no_credentials: dict[str, str],
) -> None:
    settings = Settings(project="orders-demo")
    with pytest.raises(ConfigError, match="no Google Cloud credentials for Pub/Sub") as caught:
        subscriber_client(settings)
    assert "PUBSUB_EMULATOR_HOST" in str(caught.value)
    assert "missing.json" in str(caught.value)  # what google.auth said, first sentence
    with pytest.raises(ConfigError, match="for Pub/Sub"):
        publisher_client(settings)
    with pytest.raises(ConfigError, match="for Firestore") as caught:
        firestore_client(settings)
    assert "FIRESTORE_EMULATOR_HOST" in str(caught.value)


def test_the_commands_exit_with_the_message(no_credentials: dict[str, str]) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PUBSUB_WORKER_") and not key.endswith("_EMULATOR_HOST")
    }
    env.update(no_credentials)
    env["PUBSUB_WORKER_SUBSCRIPTION"] = "projects/orders-demo/subscriptions/orders-worker"

    done = run_cli(env, "jobs", "list")
    assert done.returncode != 0
    assert "no Google Cloud credentials for" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # ``config`` is the diagnostic: it prints the settings, with the credentials as a problem.
    done = run_cli(env, "config")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "PUBSUB_WORKER_SUBSCRIPTION" in done.stdout
    assert "orders-worker" in done.stdout
    assert "credentials" in done.stdout
    assert "no Google Cloud credentials for Pub/Sub" in done.stdout
    assert "PUBSUB_EMULATOR_HOST" in done.stdout
