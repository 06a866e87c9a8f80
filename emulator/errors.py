"""Exceptions raised by the emulator harness.

Every error the harness raises on purpose derives from one base::

    EmulatorError
    ├── EmulatorNotInstalled    a component, Java or the Docker extra is missing
    ├── EmulatorStartError      an emulator exited or did not answer in time
    │   └── PortInUse           its port was taken by another process
    ├── DockerUnavailable       the Docker backend was asked for, no engine answers
    └── TopologyError           a topology file or declaration is invalid

Errors from the Google client libraries (``google.api_core.exceptions``) are
not wrapped when they come from calls the caller makes on the clients; the
harness maps them only where it makes the call itself, with ``raise ... from``.
"""

from __future__ import annotations

__all__ = [
    "DockerUnavailable",
    "EmulatorError",
    "EmulatorNotInstalled",
    "EmulatorStartError",
    "PortInUse",
    "TopologyError",
]


class EmulatorError(Exception):
    """Base class of every error the emulator harness raises."""


class EmulatorNotInstalled(EmulatorError):
    """An emulator component or the Java runtime it needs is missing.

    The message names the package to install and the environment variable
    that points the harness at another installation.
    """


class EmulatorStartError(EmulatorError):
    """An emulator exited during start-up or was not ready within the timeout.

    The message ends with the last lines of the emulator's log.
    """


class PortInUse(EmulatorStartError):
    """Another process bound the emulator's port first.

    The harness picks a new port and starts again (three attempts) before
    letting this escape.
    """


class DockerUnavailable(EmulatorError):
    """The Docker backend was requested but no Docker engine answers."""


class TopologyError(EmulatorError, ValueError):
    """A topology is invalid.

    Attributes:
        path: Where the bad value is, such as ``subscriptions[1].ack_deadline_seconds``
            (empty for a problem with the whole document).
        line: 1-based line in the TOML file, when it could be found.
        source: The file the topology was read from, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        line: int | None = None,
        source: str | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.source = source
        self.reason = message
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source + (f":{self.line}" if self.line is not None else "") + ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        subject = f"{self.path}: " if self.path else ""
        return f"{where}{subject}{self.reason}"

    def located(self, *, line: int | None, source: str | None) -> TopologyError:
        """Return a copy of this error that carries a file name and line."""
        return TopologyError(self.reason, path=self.path, line=line, source=source)
