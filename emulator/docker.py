"""Docker backend: the emulators from the official Google Cloud CLI image.

Used when ``EMULATOR_BACKEND=docker``, or in ``auto`` mode when the CLI
components are missing and a Docker engine answers. One container per
emulator, started through testcontainers (whose reaper container removes
them even if this process is killed). testcontainers is imported only here
and only when needed: install it with ``pip install 'pubsub-exactly-once[testing]'``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from emulator.errors import DockerUnavailable, EmulatorStartError

__all__ = ["IMAGE", "ContainerEmulator", "docker_available", "start_container"]

logger = logging.getLogger(__name__)

IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"
"""The official image that bundles every emulator of the Google Cloud CLI."""

_INSTALL = "pip install 'pubsub-exactly-once[testing]'"

# Port each emulator listens on inside its container, and its gcloud command.
_CONTAINER_PORT = {"pubsub": 8085, "firestore": 8080}
_GCLOUD = {
    "pubsub": "gcloud beta emulators pubsub start --host-port=0.0.0.0:{port} --project={project}",
    "firestore": "gcloud beta emulators firestore start --host-port=0.0.0.0:{port}",
}


def _default_sockets() -> list[str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    sockets = ["/var/run/docker.sock", os.path.expanduser("~/.docker/run/docker.sock")]
    if runtime:
        sockets.append(os.path.join(runtime, "docker.sock"))
    return sockets


def _ping(sock: socket.socket) -> bool:
    sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
    status = sock.recv(64).split(b"\r\n", 1)[0]
    return status.startswith(b"HTTP/") and b" 200 " in status + b" "


def docker_available(timeout_s: float = 2.0) -> bool:
    """Return whether a Docker engine answers ``GET /_ping``.

    Looks at ``DOCKER_HOST`` (``unix://`` and plain ``tcp://``; other schemes
    through the docker client library), else the usual socket paths.
    """
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("tcp://") and not os.environ.get("DOCKER_TLS_VERIFY"):
        address, _, port = host[len("tcp://") :].rstrip("/").rpartition(":")
        try:
            with socket.create_connection((address, int(port)), timeout=timeout_s) as sock:
                return _ping(sock)
        except (OSError, ValueError):
            return False
    if host and not host.startswith("unix://"):
        return _ping_with_client(timeout_s)
    paths = [host[len("unix://") :]] if host else _default_sockets()
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(path)
                if _ping(sock):
                    return True
        except OSError:
            continue
    return False


def _ping_with_client(timeout_s: float) -> bool:
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - docker raises a zoo of errors when no engine answers
        return False


def _docker_container_class() -> Any:
    try:
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            f"The Docker backend of the emulator harness needs testcontainers: {_INSTALL}"
        ) from exc
    return DockerContainer


class ContainerEmulator:
    """One emulator running in a container, reachable on a mapped host port."""

    def __init__(self, name: str, container: Any, host: str, port: int) -> None:
        self.name = name
        self.host = host
        self.port = port
        self._container = container

    @property
    def address(self) -> str:
        """``host:port`` the emulator is reachable on from this machine."""
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        """Return whether the container is running."""
        try:
            self._container.reload()
            return bool(self._container.status == "running")
        except Exception:  # noqa: BLE001
            return False

    def log_tail(self, lines: int = 20) -> str:
        """Return the last ``lines`` lines of the container's output."""
        try:
            out, err = self._container.get_logs()
        except Exception as exc:  # noqa: BLE001
            return f"(container logs unavailable: {exc})"
        text = (out + err).decode("utf-8", errors="replace").rstrip("\n")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, probe: Callable[[str, float], None], deadline: float) -> float:
        """Retry ``probe(address, timeout_s)`` until it succeeds; return the time it took."""
        started = time.monotonic()
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                probe(self.address, max(0.5, min(deadline - time.monotonic(), 10.0)))
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                last_error = exc
                time.sleep(0.2)
                continue
            return time.monotonic() - started
        raise EmulatorStartError(
            f"The {self.name} emulator container was not ready on {self.address}; "
            f"last probe error: {last_error!r}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 2.0) -> None:
        """Remove the container (forcefully: the emulators keep no state)."""
        del grace_s
        with contextlib.suppress(Exception):
            self._container.stop()


def start_container(name: str, *, project: str, image: str = IMAGE) -> ContainerEmulator:
    """Start the ``name`` (``"pubsub"`` or ``"firestore"``) emulator container.

    Returns once the container runs and its port is mapped; readiness is
    checked by the caller with :meth:`ContainerEmulator.wait_ready`.

    Raises:
        ImportError: testcontainers is not installed.
        DockerUnavailable: No Docker engine answers.
    """
    container_class = _docker_container_class()
    if not docker_available():
        raise DockerUnavailable(
            "EMULATOR_BACKEND=docker, but no Docker engine answers (is the daemon "
            "running and DOCKER_HOST right?)."
        )
    inner = _CONTAINER_PORT[name]
    command = _GCLOUD[name].format(port=inner, project=project)
    container = container_class(image).with_exposed_ports(inner).with_command(command)
    container.start()
    host = container.get_container_host_ip()
    port = int(container.get_exposed_port(inner))
    logger.info("started %s emulator container on %s:%d", name, host, port)
    return ContainerEmulator(name, container, host, port)
