"""The fleet: worker processes started with ``pubsub-worker run``, and their links.

Each worker slot owns two :class:`~emulator.TcpProxy` links, one to Pub/Sub
and one to Firestore (its ``PUBSUB_EMULATOR_HOST`` and
``FIRESTORE_EMULATOR_HOST`` point at them), so one worker can be cut off
or partitioned alone; behind each link, a gRPC proxy of the slot's own
fails or delays RPCs and tells the ledger which worker each delivery went
to. A slot outlives its processes: a killed worker is replaced by a new
incarnation on the same links.

No worker outlives the run: each runs in its own session (process group)
that :meth:`Fleet.stop` ends with SIGCONT, SIGTERM, then SIGKILL; and each
gets ``PR_SET_PDEATHSIG(SIGKILL)`` on Linux, so even a SIGKILLed
orchestrator leaves none behind. The kernel ties that signal to the thread
that spawned the child: start workers from a thread that outlives them
(the thread of the run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.chaos.baseline import MARKER_COLLECTION
from benchmarks.chaos.feeder import KEY_ATTRIBUTE
from benchmarks.chaos.grpc_proxy import FIRESTORE_SHAPES, PUBSUB_SHAPES, GrpcFaultProxy, Observer
from benchmarks.chaos.options import Options
from emulator import TcpProxy

__all__ = ["BASELINE", "HANDLER", "ROOT", "Fleet", "Worker", "worker_command", "worker_env"]

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "benchmarks.chaos.handler:handle"
BASELINE = "benchmarks.chaos.baseline"

# Runs in the child before the worker: sets the parent-death signal, checks the
# orchestrator did not die before that, then becomes the worker. (A preexec_fn
# would force a fork() of a process full of gRPC threads; see emulator.process.)
_PDEATHSIG_EXEC = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("orchestrator died before start-up")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def worker_env(
    options: Options, project: str, names: Mapping[str, str], logs: Path
) -> dict[str, str]:
    """The environment of the run's workers (the emulator hosts are added per worker).

    ``names``: ``subscription``, ``collection``, ``sink``, ``markers``,
    ``output_topic``, ``failure_topic``. The library reads the
    ``PUBSUB_WORKER_*`` variables; the baseline reads the few it needs of them
    (see :mod:`benchmarks.chaos.baseline`).
    """
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PUBSUB_WORKER_", "CHAOS_"))
        and key not in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")
    }
    env = {
        **inherited,
        "GOOGLE_CLOUD_PROJECT": project,
        "PUBSUB_WORKER_SUBSCRIPTION": names["subscription"],
        "PUBSUB_WORKER_COLLECTION": names["collection"],
        "PUBSUB_WORKER_KEY_ATTRIBUTE": KEY_ATTRIBUTE,
        "PUBSUB_WORKER_LEASE_SECONDS": str(options.lease_s),
        "PUBSUB_WORKER_MAX_PROCESSING_SECONDS": str(max(120, options.lease_s)),
        "PUBSUB_WORKER_MAX_MESSAGES": str(options.max_messages),
        "PUBSUB_WORKER_FAILURE_TOPIC": names["failure_topic"],
        "PUBSUB_WORKER_ACK_TIMEOUT_SECONDS": "20",
        "PUBSUB_WORKER_SHUTDOWN_GRACE_SECONDS": "2",
        "PUBSUB_WORKER_LOG_FORMAT": "json",
        "CHAOS_EFFECTS": str(logs / "effects.jsonl"),
        "CHAOS_SINK_COLLECTION": names["sink"],
        "CHAOS_OUTPUT_TOPIC": names["output_topic"],
        "CHAOS_STORE": options.store,
    }
    if options.unfenced:
        env["CHAOS_UNFENCED"] = "1"
    if options.handler != "library":
        env["CHAOS_BASELINE"] = options.handler
        env[MARKER_COLLECTION] = names["markers"]
    return env


def worker_command(handler: str = "library") -> list[str]:
    """The command of a worker process, from this interpreter's tools.

    ``library``: ``pubsub-worker run benchmarks.chaos.handler:handle``; any
    other value: the baseline, ``python -m benchmarks.chaos.baseline`` (its
    variant is in the environment).
    """
    if handler == "library":
        beside = Path(sys.executable).with_name("pubsub-worker")
        script = str(beside) if beside.exists() else shutil.which("pubsub-worker")
        base = [script] if script else [sys.executable, "-m", "pubsub_worker.cli"]
        command = [*base, "run", HANDLER]
    else:
        command = [sys.executable, "-m", BASELINE]
    if sys.platform.startswith("linux"):
        return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *command]
    return command


@dataclass
class Worker:
    """One slot of the fleet: its links and its current process (if any)."""

    name: str
    pubsub_proxy: GrpcFaultProxy
    firestore_proxy: GrpcFaultProxy
    pubsub_link: TcpProxy
    firestore_link: TcpProxy
    log_dir: Path
    env: Mapping[str, str]
    command: list[str] = field(default_factory=worker_command)
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    paused: bool = False
    exits: list[int] = field(default_factory=list)
    """Exit codes of incarnations that ended without being killed by the run."""
    pids: list[int] = field(default_factory=list)
    """Process id of each incarnation, in order."""
    started_wall: float = 0.0
    """Wall time the current incarnation was started."""

    @property
    def pid(self) -> int | None:
        """Process id of the current incarnation, if one runs."""
        return self.process.pid if self.process is not None else None

    @property
    def up(self) -> bool:
        """A process runs (paused or not)."""
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        """Log of the current incarnation (JSON lines)."""
        return self.log_dir / f"{self.name}-{self.incarnation}.log"

    @property
    def stats_path(self) -> Path:
        """Counters file of the current incarnation (see :mod:`benchmarks.chaos.handler`)."""
        return self.log_dir / f"{self.name}-{self.incarnation}.stats.json"

    def start(self) -> None:
        """Start a new incarnation on this slot's links."""
        self.incarnation += 1
        env = {
            **self.env,
            "PUBSUB_EMULATOR_HOST": self.pubsub_link.address,
            "FIRESTORE_EMULATOR_HOST": self.firestore_link.address,
            "CHAOS_STATS": str(self.stats_path),
            "PYTHONUNBUFFERED": "1",
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self.pids.append(self.process.pid)
        self.started_wall = time.time()
        self.paused = False

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        if self.process is None:
            return
        self.send(signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP the process group."""
        self.send(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT the process group."""
        self.send(signal.SIGCONT)
        self.paused = False

    def reap(self) -> int | None:
        """If the process ended by itself, record its exit code and return it."""
        if self.process is None or self.process.poll() is None:
            return None
        code = self.process.returncode
        self.exits.append(code)
        self.process = None
        self.paused = False
        return code

    def stop(self, grace_s: float) -> None:
        """SIGCONT, SIGTERM, wait ``grace_s``, then SIGKILL whatever is left of the group."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self.send(signal.SIGCONT)
            self.send(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        self.send(signal.SIGKILL)  # the group: no helper process survives its leader
        process.wait(timeout=10)
        self.process = None
        self.paused = False

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the current incarnation's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def send(self, signum: int) -> None:
        """Signal the process group (only while its leader is unreaped)."""
        # Only while the leader is unreaped: its group id cannot have been reused.
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)


class Fleet:
    """``size`` worker slots, each with its own gRPC proxies and links to the emulators.

    ``handler`` is what the workers run: ``library`` or a baseline variant
    (see :func:`worker_command`).

    A slot's chain: worker -> :class:`~emulator.TcpProxy` (cuts, partitions) ->
    :class:`~benchmarks.chaos.grpc_proxy.GrpcFaultProxy` (RPC errors, latency;
    what it sees goes to ``observer(worker name)``) -> emulator.
    """

    def __init__(
        self,
        size: int,
        *,
        pubsub_host: str,
        firestore_host: str,
        env: Mapping[str, str],
        log_dir: Path,
        seed: int,
        observer: Callable[[str], Observer] | None = None,
        handler: str = "library",
    ) -> None:
        self.log_dir = log_dir
        self.workers: list[Worker] = []
        try:
            for index in range(size):
                name = f"w{index}"
                pubsub = GrpcFaultProxy(
                    pubsub_host,
                    shapes=PUBSUB_SHAPES,
                    observer=observer(name) if observer else None,
                    seed=seed * 100 + index,
                    name=f"chaos-{name}-pubsub",
                )
                firestore = GrpcFaultProxy(
                    firestore_host,
                    shapes=FIRESTORE_SHAPES,
                    seed=seed * 100 + 50 + index,
                    name=f"chaos-{name}-firestore",
                )
                self.workers.append(
                    Worker(
                        name=name,
                        pubsub_proxy=pubsub,
                        firestore_proxy=firestore,
                        pubsub_link=TcpProxy(pubsub.address),
                        firestore_link=TcpProxy(firestore.address),
                        log_dir=log_dir,
                        env=env,
                        command=worker_command(handler),
                    )
                )
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start every slot's first incarnation."""
        for worker in self.workers:
            worker.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every worker at once, then make sure none is left. Idempotent."""
        for worker in self.workers:
            if worker.up:
                worker.send(signal.SIGCONT)
                worker.send(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            worker.stop(max(deadline - time.monotonic(), 0.1))

    def close(self) -> None:
        """Stop the workers, close the links and the proxies."""
        self.stop()
        for worker in self.workers:
            worker.pubsub_link.close()
            worker.firestore_link.close()
            worker.pubsub_proxy.close()
            worker.firestore_proxy.close()

    def names(self) -> dict[int, str]:
        """``{pid: "w1#2"}``: which slot and incarnation each process was."""
        return {
            pid: f"{worker.name}#{n}"
            for worker in self.workers
            for n, pid in enumerate(worker.pids, start=1)
        }

    def log_paths(self) -> list[Path]:
        """Every incarnation's log, in order."""
        return sorted(self.log_dir.glob("w*-*.log"))

    def stats_paths(self) -> list[Path]:
        """Every incarnation's counters file."""
        return sorted(self.log_dir.glob("w*-*.stats.json"))
