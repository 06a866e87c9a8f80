"""The Docker backend: runs where a Docker engine answers, skips elsewhere."""

from __future__ import annotations

import sys

import pytest

from emulator import (
    Backend,
    DockerUnavailable,
    EmulatorError,
    docker_available,
    start_emulators,
)
from emulator.docker import start_container
from emulator.probes import firestore_ready, pubsub_ready


@pytest.mark.docker
@pytest.mark.emulator
def test_docker_backend_starts_both() -> None:
    if not docker_available():
        pytest.skip("no Docker engine answers")
    with start_emulators("docker-test", backend="docker", timeout_s=300) as emu:
        assert emu.backend is Backend.DOCKER
        assert emu.pubsub_host is not None
        assert emu.firestore_host is not None
        pubsub_ready(emu.pubsub_host, 10)
        firestore_ready(emu.firestore_host, 10)
        emu.reset_firestore()


def test_docker_backend_without_engine_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    if docker_available():
        pytest.skip("a Docker engine answers here")
    monkeypatch.setenv("EMULATOR_BACKEND", "docker")
    with pytest.raises(DockerUnavailable, match="no Docker engine answers"):
        start_emulators("docker-test")


def test_missing_testcontainers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "testcontainers.core.container", None)
    with pytest.raises(ImportError, match=r"pip install 'pubsub-exactly-once\[testing\]'"):
        start_container("pubsub", project="docker-test")


def test_unknown_backend_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMULATOR_BACKEND", "kubernetes")
    with pytest.raises(EmulatorError, match=r"'kubernetes' is not one of auto\|subprocess\|docker"):
        start_emulators("docker-test")
