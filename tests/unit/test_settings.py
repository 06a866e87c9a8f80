"""Settings come from the environment; a bad value names the variable and what it accepts."""

import ast
from pathlib import Path

import pytest

from pubsub_worker import ConfigError, Settings, flow_control
from pubsub_worker import settings as settings_module

CLOUD_RUN_MARKERS = ["CLOUD_RUN_WORKER_POOL", "K_SERVICE", "CLOUD_RUN_JOB"]

_VARS = [
    "GOOGLE_CLOUD_PROJECT",
    "PUBSUB_EMULATOR_HOST",
    "FIRESTORE_EMULATOR_HOST",
    *CLOUD_RUN_MARKERS,
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("PUBSUB_WORKER_") or name in _VARS:
            monkeypatch.delenv(name)


def test_defaults_match_the_documented_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "projects/p1/subscriptions/jobs-worker")
    settings = Settings.from_env()
    assert settings.subscription_path == "projects/p1/subscriptions/jobs-worker"
    assert settings.project_id == "p1"
    assert settings.collection == "pubsub_worker_jobs"
    assert settings.key_attribute is None
    assert (settings.lease_seconds, settings.max_processing_seconds) == (150, 480)
    assert settings.max_attempts == 5
    assert settings.failure_topic_path is None
    assert settings.allow_at_least_once is False


def test_an_id_is_resolved_with_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "demo-project")
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "jobs-worker")
    monkeypatch.setenv("PUBSUB_WORKER_FAILURE_TOPIC", "jobs-failed")
    monkeypatch.setenv("PUBSUB_WORKER_LEASE_SECONDS", "10")
    monkeypatch.setenv("PUBSUB_WORKER_MAX_PROCESSING_SECONDS", "60")
    monkeypatch.setenv("PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE", "true")
    settings = Settings.from_env()
    assert settings.subscription_path == "projects/demo-project/subscriptions/jobs-worker"
    assert settings.failure_topic_path == "projects/demo-project/topics/jobs-failed"
    assert settings.lease_seconds == 10
    assert settings.allow_at_least_once is True


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PUBSUB_WORKER_LEASE_SECONDS", "5", "from 10 to 600"),
        ("PUBSUB_WORKER_LEASE_SECONDS", "601", "from 10 to 600"),
        ("PUBSUB_WORKER_LEASE_SECONDS", "ten", "from 10 to 600"),
        ("PUBSUB_WORKER_MAX_ATTEMPTS", "0", "from 1 to 100"),
        ("PUBSUB_WORKER_MAX_PROCESSING_SECONDS", "20", "at least LEASE_SECONDS"),
        ("PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE", "maybe", "true or false"),
        ("PUBSUB_WORKER_COLLECTION", "jobs/evil", "collection id"),
        ("PUBSUB_WORKER_COLLECTION", "__jobs__", "collection id"),
        ("PUBSUB_WORKER_KEY_ATTRIBUTE", "googkey", "attribute name"),
        ("PUBSUB_WORKER_SUBSCRIPTION", "projects/p/topics/t", "subscriptions"),
        ("PUBSUB_WORKER_SUBSCRIPTION", "a/b", "subscriptions"),
        ("FIRESTORE_EMULATOR_HOST", "localhost", "HOST:PORT"),
        ("PUBSUB_WORKER_LOG_FORMAT", "xml", "text or json"),
        ("PUBSUB_WORKER_PREFETCH_MESSAGES", "-1", "from 0 to 1000"),
        ("PUBSUB_WORKER_PREFETCH_MESSAGES", "21", "at most MAX_MESSAGES (20)"),
    ],
)
def test_bad_values_name_the_variable_and_the_range(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "demo-project")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert variable in message
    assert expected in message


def test_an_unknown_prefixed_variable_is_a_typo_not_a_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PUBSUB_WORKER_LEASE_SECOND", "30")
    with pytest.raises(ConfigError, match="PUBSUB_WORKER_LEASE_SECOND"):
        Settings.from_env()


def test_subscription_id_without_project_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "jobs-worker")
    with pytest.raises(ConfigError, match="GOOGLE_CLOUD_PROJECT"):
        Settings.from_env()


def test_missing_subscription_is_reported_when_needed() -> None:
    settings = Settings(project="demo-project")
    with pytest.raises(ConfigError, match="PUBSUB_WORKER_SUBSCRIPTION"):
        _ = settings.subscription_path


def test_settings_are_frozen() -> None:
    settings = Settings(project="demo-project")
    with pytest.raises(Exception, match="frozen"):
        settings.lease_seconds = 20


def test_run_admits_a_prefetched_message_per_thread_unless_told_otherwise() -> None:
    settings = Settings(project="demo-project", lease_seconds=30, max_processing_seconds=300)
    control = flow_control(settings)
    assert settings.max_messages == 20  # threads
    assert control.max_messages == settings.admitted_messages == 40
    assert control.max_lease_duration == 300 + 30  # the cap from receipt, plus a lease
    assert control.min_duration_per_lease_extension == 30
    assert control.max_duration_per_lease_extension == 30
    few = Settings(project="demo-project", max_messages=4, prefetch_messages=1)
    assert flow_control(few).max_messages == 5
    none = Settings(project="demo-project", max_messages=4, prefetch_messages=0)
    assert flow_control(none).max_messages == 4


@pytest.mark.parametrize("marker", CLOUD_RUN_MARKERS)
def test_on_cloud_run_from_env_shortens_the_grace_to_fit_its_sigterm_window(
    monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    """What run() and exactly_once(...).start() read: no CLI needed for the platform default."""
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "projects/p1/subscriptions/jobs-worker")
    monkeypatch.setenv(marker, "orders-worker")
    assert Settings.from_env().shutdown_grace_seconds == 5


def test_a_set_grace_or_an_override_wins_over_cloud_runs_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("K_SERVICE", "orders")
    assert Settings.from_env(shutdown_grace_seconds=12).shutdown_grace_seconds == 12
    monkeypatch.setenv("PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS", "8")
    assert Settings.from_env().shutdown_grace_seconds == 8
    assert Settings.from_env(shutdown_grace_seconds=0).shutdown_grace_seconds == 0


def test_off_cloud_run_the_grace_is_the_librarys_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().shutdown_grace_seconds == 30
    monkeypatch.setenv("K_SERVICE", "")  # set but empty: not Cloud Run
    assert Settings.from_env().shutdown_grace_seconds == 30
    # Built directly, settings take no platform default.
    monkeypatch.setenv("CLOUD_RUN_WORKER_POOL", "pool")
    assert Settings().shutdown_grace_seconds == 30


def test_settings_import_nothing_above_them() -> None:
    """settings.py is at the bottom of the layers: config_report imports it, not the reverse.

    It imports only the modules beside it at the bottom: errors, the attribute names and
    the variables' names.
    """
    tree = ast.parse(Path(settings_module.__file__ or "").read_text())
    internal = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    }
    assert internal == {"errors", "_attributes", "_variables"}
