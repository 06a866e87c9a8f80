"""Finding the CLI components and Java; the errors when they are missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator import EmulatorNotInstalled, find_components, start_emulators
from emulator.components import pubsub_command


def _fake_sdk(root: Path, *, pubsub: bool = True, firestore: bool = True) -> Path:
    if pubsub:
        lib = root / "platform" / "pubsub-emulator" / "lib"
        lib.mkdir(parents=True)
        (lib / "cloud-pubsub-emulator-0.1.0-all.jar").touch()
        (lib / "cloud-pubsub-emulator-0.9.0-all.jar").touch()
    if firestore:
        fs = root / "platform" / "cloud-firestore-emulator"
        fs.mkdir(parents=True)
        (fs / "cloud-firestore-emulator.jar").touch()
    return root


def test_empty_sdk_root_names_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "EMULATOR_SDK_ROOT": str(tmp_path)}
    with pytest.raises(EmulatorNotInstalled) as info:
        find_components(environ=env)
    message = str(info.value)
    assert (
        "apt-get install google-cloud-cli-pubsub-emulator google-cloud-cli-firestore-emulator"
        in message
    )
    assert "openjdk-17-jre-headless" in message
    assert str(tmp_path) in message
    assert "EMULATOR_SDK_ROOT" in message


def test_only_the_missing_component_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "EMULATOR_SDK_ROOT": str(_fake_sdk(tmp_path, firestore=False))}
    with pytest.raises(EmulatorNotInstalled) as info:
        find_components(environ=env)
    assert "google-cloud-cli-firestore-emulator" in str(info.value)
    assert "google-cloud-cli-pubsub-emulator" not in str(info.value)
    # Asking only for Pub/Sub succeeds, and takes the newest jar.
    found = find_components(firestore=False, environ=env)
    assert found.pubsub_jar is not None
    assert found.pubsub_jar.name == "cloud-pubsub-emulator-0.9.0-all.jar"
    assert pubsub_command(found, "127.0.0.1", 1234)[-2:] == ["--host=127.0.0.1", "--port=1234"]


def test_missing_java_names_a_runtime(tmp_path: Path) -> None:
    env = {
        "EMULATOR_SDK_ROOT": str(_fake_sdk(tmp_path / "sdk")),
        "PATH": str(tmp_path / "empty-bin"),
    }
    with pytest.raises(EmulatorNotInstalled, match="openjdk-17-jre-headless"):
        find_components(environ=env)


def test_old_java_is_refused(tmp_path: Path) -> None:
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    java = jdk / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    (jdk / "release").write_text('JAVA_VERSION="1.8.0_402"\n')
    env = {"EMULATOR_SDK_ROOT": str(_fake_sdk(tmp_path / "sdk")), "JAVA_HOME": str(jdk)}
    with pytest.raises(EmulatorNotInstalled, match="is Java 8"):
        find_components(environ=env)


def test_start_emulators_raises_the_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMULATOR_SDK_ROOT", str(tmp_path))
    with pytest.raises(EmulatorNotInstalled, match="apt-get install"):
        start_emulators(backend="subprocess")


def test_cli_prints_the_error_not_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "EMULATOR_SDK_ROOT": str(tmp_path), "EMULATOR_BACKEND": "subprocess"}
    result = subprocess.run(
        [sys.executable, "-m", "emulator", "up", "--log-dir", str(tmp_path / "logs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "apt-get install google-cloud-cli-pubsub-emulator" in result.stderr
    assert "Traceback" not in result.stderr
