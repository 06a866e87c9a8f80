"""One emulator JVM run as a child process that cannot outlive its owner.

Guarantees, in order of strength:

* The JVM runs in a new session (its own process group). :meth:`EmulatorProcess.stop`
  sends SIGTERM to the whole group, SIGKILL after a grace period, sweeps the
  group with SIGKILL once the leader has exited (before it is reaped, so the
  group id cannot have been reused), then reaps it.
* Every process still running when the interpreter exits normally (including
  after Ctrl-C and failing tests) is stopped by an ``atexit`` hook.
* On Linux the child gets ``PR_SET_PDEATHSIG(SIGKILL)``, so even a SIGKILLed
  owner does not leave a JVM behind. The kernel ties this to the *thread*
  that started the child: start emulators from a thread that lives as long
  as they should (the main thread, in practice). See :func:`_with_death_signal`
  for why this is not a ``preexec_fn``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from emulator.errors import EmulatorStartError, PortInUse

__all__ = ["EmulatorProcess", "free_port", "listens_on", "port_open"]

logger = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 5.0  # per attempt: a silent listener must not eat the whole deadline
_BIND_FAILURES = ("Address already in use", "BindException", "Failed to bind")

# Guards _LIVE; touched by spawn(), stop() and the atexit hook.
_LIVE_LOCK = threading.Lock()
_LIVE: set[EmulatorProcess] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Return whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def listens_on(pid: int, port: int) -> bool | None:
    """Return whether process ``pid`` holds a listening TCP socket on ``port``.

    Read from ``/proc``; None where that cannot tell (not Linux, no access).
    Guards against a port taken by someone else between :func:`free_port`
    and the emulator's bind: the other server would answer the probe.
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes: set[str] = set()
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # fields: sl local_address rem_address st ... inode (index 9); 0A = LISTEN
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and fields[9] in inodes
                and int(fields[1].rpartition(":")[2], 16) == port
            ):
                return True
    return False


# Runs in the child instead of a ``preexec_fn``: sets the parent-death signal,
# checks the owner did not die before that, then becomes the real command.
_PDEATHSIG_EXEC = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("emulator owner died before start-up")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _with_death_signal(command: Sequence[str]) -> list[str]:
    """Prefix ``command`` so the kernel SIGKILLs it when its owner dies (Linux).

    A ``preexec_fn`` would do the same in fewer steps, but it forces a plain
    ``fork()`` that runs gRPC's fork handlers in a process full of gRPC
    threads: measured here, about one child in ten crashed (SIGSEGV/SIGABRT)
    before its exec, and live channels of the parent were corrupted. Without
    a ``preexec_fn`` the child is started with ``vfork()``, which runs no
    fork handlers; a short Python prologue sets the signal and ``exec``s.
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *command]


class EmulatorProcess:
    """A running emulator JVM with its log file.

    Create with :meth:`spawn`; wait with :meth:`wait_ready`; end with
    :meth:`stop` (idempotent, thread-safe).
    """

    def __init__(
        self, name: str, popen: subprocess.Popen[bytes], host: str, port: int, log_path: Path
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.log_path = log_path
        self._popen = popen
        self._stop_lock = threading.Lock()
        self._stopped = False

    @classmethod
    def spawn(
        cls,
        name: str,
        command: Sequence[str],
        *,
        host: str,
        port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> EmulatorProcess:
        """Start ``command`` in a new session, output appended to ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                _with_death_signal(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                close_fds=True,
            )
        proc = cls(name, popen, host, port, log_path)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        logger.info(
            "started %s emulator pid=%d on %s, log %s", name, popen.pid, proc.address, log_path
        )
        return proc

    @property
    def pid(self) -> int:
        """Process id of the JVM (also its process group and session id)."""
        return self._popen.pid

    @property
    def address(self) -> str:
        """``host:port`` the emulator listens on."""
        return f"{self.host}:{self.port}"

    def exit_status(self) -> int | None:
        """Return the exit status if the process has exited, without reaping it.

        Negative numbers are signals, as in :attr:`subprocess.Popen.returncode`.
        """
        if self._popen.returncode is not None:
            return self._popen.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._popen.poll()
        if info is None or info.si_pid == 0:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return -info.si_status

    def alive(self) -> bool:
        """Return whether the JVM is still running."""
        return self.exit_status() is None

    def log_tail(self, lines: int = 20) -> str:
        """Return the last ``lines`` lines of the log file."""
        try:
            data = self.log_path.read_bytes()[-16384:]
        except OSError as exc:
            return f"(log {self.log_path} unreadable: {exc})"
        text = data.decode("utf-8", errors="replace").rstrip("\n")
        return "\n".join(text.splitlines()[-lines:])

    def bind_failed(self) -> bool:
        """Return whether the log says the port was taken."""
        tail = self.log_tail(60)
        return any(marker in tail for marker in _BIND_FAILURES)

    def wait_ready(self, probe: Callable[[str, float], None], deadline: float) -> float:
        """Wait until ``probe(address, timeout_s)`` succeeds; return the time it took.

        The port is polled first (cheap); then the probe, a real RPC, is
        retried until it returns without raising.

        Raises:
            PortInUse: The log says the port was taken.
            EmulatorStartError: The process exited, or ``deadline`` (a
                ``time.monotonic()`` value) passed. The message carries the
                log's last lines.
        """
        started = time.monotonic()
        last_error: BaseException | None = None
        while True:
            status = self.exit_status()
            if status is not None:
                raise EmulatorStartError(
                    f"The {self.name} emulator exited with status {status} during start-up "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            # The Pub/Sub emulator logs a BindException and keeps running.
            if self.bind_failed():
                raise PortInUse(
                    f"The {self.name} emulator could not bind {self.address} "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                cause = f"; last probe error: {last_error!r}" if last_error else ""
                raise EmulatorStartError(
                    f"The {self.name} emulator on {self.address} was not ready after "
                    f"{time.monotonic() - started:.1f} s{cause} (log {self.log_path}):\n"
                    f"{self.log_tail()}"
                )
            if not port_open(self.host, self.port):
                time.sleep(0.05)
                continue
            try:
                probe(self.address, max(0.5, min(remaining, _PROBE_TIMEOUT_S)))
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                last_error = exc
                time.sleep(0.1)
                continue
            if listens_on(self.pid, self.port) is False:
                # Someone else answered on our port; our JVM will fail to bind.
                last_error = EmulatorStartError(f"{self.address} is served by another process")
                time.sleep(0.1)
                continue
            return time.monotonic() - started

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the process group: SIGTERM, SIGKILL after ``grace_s``, then reap."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            pid = self.pid
            if self.exit_status() is None:
                self._signal_group(signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while self.exit_status() is None and time.monotonic() < deadline:
                    time.sleep(0.02)
            # The leader is a zombie or still running here, so the group id
            # is still ours: sweep whatever else is in the group.
            self._signal_group(signal.SIGKILL)
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
                logger.error("%s emulator pid=%d did not die after SIGKILL", self.name, pid)
            _wait_group_gone(pid)
            with _LIVE_LOCK:
                _LIVE.discard(self)
            logger.info("stopped %s emulator pid=%d", self.name, pid)

    def _signal_group(self, signum: int) -> None:
        if self._popen.returncode is not None:
            return  # reaped: the group id may belong to someone else now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def __repr__(self) -> str:
        state = "running" if self.alive() else "exited"
        return f"<EmulatorProcess {self.name} pid={self.pid} {self.address} {state}>"


def _live_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``; empty where /proc is absent."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _wait_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """Wait until no process of the group is alive: SIGKILL is delivered asynchronously.

    While any member lives the group id cannot be reused, so signalling it again
    reaches only what is left of ours.
    """
    deadline = time.monotonic() + timeout_s
    while (members := _live_group_members(pgid)) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.02)
    if members:  # pragma: no cover - only an unkillable (D-state) process stays
        logger.error("process group %d still has members %s after SIGKILL", pgid, members)


def stop_all() -> None:
    """Stop every emulator process this interpreter started and has not stopped."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        try:
            proc.stop(grace_s=1.0)
        except Exception:
            logger.exception("could not stop %r", proc)


atexit.register(stop_all)
