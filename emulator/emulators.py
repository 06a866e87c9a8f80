"""Start the Pub/Sub and Firestore emulators together and hand out their addresses.

>>> with start_emulators() as emu:            # doctest: +SKIP
...     emu.export_env()
...     print(emu.pubsub_host, emu.firestore_host, f"ready in {emu.startup_s:.1f} s")

Both emulators are spawned at once and probed in parallel; "ready" means a
real RPC succeeded (Pub/Sub ``ListTopics``, a Firestore write). The backend is
chosen by the ``backend`` argument or ``EMULATOR_BACKEND``:

* ``subprocess``: the Google Cloud CLI components on this machine;
* ``docker``: the official container image through testcontainers;
* ``auto`` (default): ``subprocess`` if the components are installed, else
  ``docker`` if an engine answers, else :class:`EmulatorNotInstalled`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from emulator import components as _components
from emulator import docker as _docker
from emulator import probes
from emulator.errors import EmulatorError, EmulatorNotInstalled, PortInUse
from emulator.process import EmulatorProcess, free_port

if TYPE_CHECKING:
    from emulator.bootstrap import Bootstrapped
    from emulator.topology import Topology

__all__ = ["DEFAULT_PROJECT", "Backend", "Emulators", "start_emulators"]

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "pubsub-worker-local"
"""Project id used when none is given."""

BACKEND_ENV = "EMULATOR_BACKEND"
_MAX_BIND_ATTEMPTS = 3
_PROBES: dict[str, Callable[[str, float], None]] = {
    "pubsub": probes.pubsub_ready,
    "firestore": probes.firestore_ready,
}
_COMMANDS = {
    "pubsub": _components.pubsub_command,
    "firestore": _components.firestore_command,
}


class Backend(str, Enum):
    """Where the emulators run."""

    AUTO = "auto"
    """The CLI components if installed, else Docker if an engine answers."""
    SUBPROCESS = "subprocess"
    """Java processes from the local Google Cloud CLI components."""
    DOCKER = "docker"
    """Containers of the official Google Cloud CLI emulators image."""


class _Handle(Protocol):
    name: str

    @property
    def address(self) -> str: ...

    def alive(self) -> bool: ...

    def log_tail(self, lines: int = 20) -> str: ...

    def wait_ready(self, probe: Callable[[str, float], None], deadline: float) -> float: ...

    def stop(self, grace_s: float = 2.0) -> None: ...


class Emulators:
    """Running emulators: their addresses, environment, reset and stop.

    Attributes:
        project: The Google Cloud project id the clients should use.
        backend: ``Backend.SUBPROCESS`` or ``Backend.DOCKER``.
        startup_s: Wall time from the start call until every emulator was ready.
        ready_s: Per emulator (``"pubsub"``, ``"firestore"``), seconds from
            spawn to the first successful RPC.
        log_dir: Folder of the emulators' log files (subprocess backend).
    """

    def __init__(
        self,
        *,
        project: str,
        handles: Mapping[str, _Handle],
        backend: Backend,
        startup_s: float,
        ready_s: Mapping[str, float],
        log_dir: Path | None,
    ) -> None:
        self.project = project
        self.backend = backend
        self.startup_s = startup_s
        self.ready_s = dict(ready_s)
        self.log_dir = log_dir
        self._handles = dict(handles)

    @property
    def pubsub_host(self) -> str | None:
        """``host:port`` of the Pub/Sub emulator (None if not started)."""
        handle = self._handles.get("pubsub")
        return handle.address if handle else None

    @property
    def firestore_host(self) -> str | None:
        """``host:port`` of the Firestore emulator (None if not started)."""
        handle = self._handles.get("firestore")
        return handle.address if handle else None

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the emulator JVMs (empty for the Docker backend)."""
        return {n: h.pid for n, h in self._handles.items() if isinstance(h, EmulatorProcess)}

    @property
    def log_paths(self) -> dict[str, Path]:
        """Log file of each emulator (empty for the Docker backend)."""
        return {n: h.log_path for n, h in self._handles.items() if isinstance(h, EmulatorProcess)}

    def env(self) -> dict[str, str]:
        """Return the variables the Google clients read to use these emulators."""
        variables: dict[str, str] = {}
        if self.pubsub_host:
            variables["PUBSUB_EMULATOR_HOST"] = self.pubsub_host
        if self.firestore_host:
            variables["FIRESTORE_EMULATOR_HOST"] = self.firestore_host
        variables["GOOGLE_CLOUD_PROJECT"] = self.project
        return variables

    def export_env(self, environ: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
        """Set :meth:`env` in ``environ`` (default ``os.environ``).

        Returns:
            The values replaced (None where a variable was unset), to restore later.
        """
        target = os.environ if environ is None else environ
        previous: dict[str, str | None] = {}
        for key, value in self.env().items():
            previous[key] = target.get(key)
            target[key] = value
        return previous

    def reset_firestore(self) -> None:
        """Delete every document of :attr:`project` in the Firestore emulator."""
        if self.firestore_host is None:
            raise EmulatorError("The Firestore emulator was not started.")
        probes.reset_firestore(self.firestore_host, self.project)

    def bootstrap(self, topology: Topology) -> Bootstrapped:
        """Create the topics and subscriptions of ``topology`` that are missing."""
        from emulator.bootstrap import bootstrap  # noqa: PLC0415 - keeps import light

        if self.pubsub_host is None:
            raise EmulatorError("The Pub/Sub emulator was not started.")
        return bootstrap(topology, project=self.project, pubsub_host=self.pubsub_host)

    def alive(self) -> bool:
        """Return whether every emulator is still running."""
        return all(handle.alive() for handle in self._handles.values())

    def log_tail(self, name: str, lines: int = 20) -> str:
        """Return the last lines of the ``name`` emulator's output."""
        return self._handles[name].log_tail(lines)

    def stop(self) -> None:
        """Stop every emulator and wait for it to be gone. Idempotent."""
        _stop_all(self._handles.values())

    def __enter__(self) -> Emulators:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{n}={h.address}" for n, h in self._handles.items())
        return f"<Emulators {self.backend.value} project={self.project} {hosts}>"


def _stop_all(handles: Iterable[_Handle]) -> None:
    for handle in list(handles):
        try:
            handle.stop()
        except Exception:
            logger.exception("could not stop the %s emulator", handle.name)


def _resolve_backend(backend: Backend | str | None, names: list[str]) -> Backend:
    raw = backend if backend is not None else os.environ.get(BACKEND_ENV, "") or "auto"
    try:
        chosen = Backend(raw.lower() if isinstance(raw, str) else raw)
    except ValueError:
        choices = "|".join(b.value for b in Backend)
        raise EmulatorError(f"{BACKEND_ENV}={raw!r} is not one of {choices}.") from None
    if chosen is not Backend.AUTO:
        return chosen
    try:
        _components.find_components(pubsub="pubsub" in names, firestore="firestore" in names)
    except EmulatorNotInstalled as exc:
        if _docker.docker_available():
            logger.info("emulator components missing (%s); using Docker", exc)
            return Backend.DOCKER
        raise EmulatorNotInstalled(f"{exc} (No Docker engine answers either.)") from None
    return Backend.SUBPROCESS


def _wait_all(handles: Mapping[str, _Handle], deadline: float) -> dict[str, float | BaseException]:
    """Probe every handle in parallel; return its ready time or its error."""
    results: dict[str, float | BaseException] = {}
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=len(handles), thread_name_prefix="emulator-ready"
    ) as pool:
        futures = {
            name: pool.submit(handle.wait_ready, _PROBES[name], deadline)
            for name, handle in handles.items()
        }
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                results[name] = exc
    return results


def _start_subprocesses(
    names: list[str], host: str, log_dir: Path, deadline: float
) -> tuple[dict[str, _Handle], dict[str, float]]:
    comps = _components.find_components(pubsub="pubsub" in names, firestore="firestore" in names)
    handles: dict[str, _Handle] = {}
    ready: dict[str, float] = {}

    # Spawn from this thread: the parent-death signal follows the spawning
    # thread, and the probe threads end as soon as the emulators are ready.
    def spawn(name: str) -> EmulatorProcess:
        port = free_port(host)
        return EmulatorProcess.spawn(
            name,
            _COMMANDS[name](comps, host, port),
            host=host,
            port=port,
            log_path=log_dir / f"{name}-{port}.log",
        )

    try:
        pending: dict[str, _Handle] = {name: spawn(name) for name in names}
        handles.update(pending)
        for attempt in range(1, _MAX_BIND_ATTEMPTS + 1):
            retry: dict[str, _Handle] = {}
            for name, result in _wait_all(pending, deadline).items():
                if isinstance(result, float):
                    ready[name] = result
                    continue
                if not (isinstance(result, PortInUse) and attempt < _MAX_BIND_ATTEMPTS):
                    raise result
                logger.warning("%s emulator lost its port to another process; retrying", name)
                pending[name].stop()
                retry[name] = handles[name] = spawn(name)
            if not retry:
                break
            pending = retry
    except BaseException:
        _stop_all(handles.values())
        raise
    return handles, ready


def _start_containers(
    names: list[str], project: str, deadline: float
) -> tuple[dict[str, _Handle], dict[str, float]]:
    handles: dict[str, _Handle] = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
            futures = {n: pool.submit(_docker.start_container, n, project=project) for n in names}
            errors: list[BaseException] = []
            for name, future in futures.items():
                try:
                    handles[name] = future.result()
                except Exception as exc:  # noqa: BLE001 - raised below, after cleanup
                    errors.append(exc)
            if errors:
                raise errors[0]
        ready: dict[str, float] = {}
        for name, result in _wait_all(handles, deadline).items():
            if not isinstance(result, float):
                raise result
            ready[name] = result
    except BaseException:
        _stop_all(handles.values())
        raise
    return handles, ready


def start_emulators(
    project: str = DEFAULT_PROJECT,
    *,
    pubsub: bool = True,
    firestore: bool = True,
    timeout_s: float = 60.0,
    backend: Backend | str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
) -> Emulators:
    """Start the requested emulators in parallel and return once each answers an RPC.

    Args:
        project: Project id for the clients (any valid id; nothing is created).
        pubsub: Start the Pub/Sub emulator.
        firestore: Start the Firestore emulator.
        timeout_s: Seconds until every emulator must be ready.
        backend: ``"auto"``, ``"subprocess"`` or ``"docker"``; default
            ``EMULATOR_BACKEND`` or ``auto``.
        log_dir: Folder for the emulators' log files; default a new temporary folder.
        host: Loopback address the subprocess emulators bind to.

    Raises:
        EmulatorNotInstalled: Components, Java or Docker are missing.
        EmulatorStartError: An emulator exited or was not ready in time (the
            message carries the end of its log). Nothing is left running.
        ImportError: The Docker backend without testcontainers installed.
    """
    names = [name for name, wanted in (("pubsub", pubsub), ("firestore", firestore)) if wanted]
    if not names:
        raise EmulatorError("Nothing to start: pubsub and firestore are both False.")
    started = time.monotonic()
    deadline = started + timeout_s
    chosen = _resolve_backend(backend, names)
    folder: Path | None = None
    if chosen is Backend.DOCKER:
        handles, ready = _start_containers(names, project, deadline)
    else:
        folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="emulator-logs-"))
        handles, ready = _start_subprocesses(names, host, folder, deadline)
    emulators = Emulators(
        project=project,
        handles=handles,
        backend=chosen,
        startup_s=time.monotonic() - started,
        ready_s=ready,
        log_dir=folder,
    )
    logger.info("emulators ready in %.2f s: %r", emulators.startup_s, emulators)
    return emulators
