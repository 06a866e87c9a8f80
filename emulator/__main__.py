"""Command line: ``python -m emulator up [--topology FILE] [--project P]``.

Starts both emulators, creates the topology (the bundled
``topology.example.toml`` unless ``--topology`` or ``--no-topology``), prints
``export`` lines for a shell and ``ready in N.N s``, then runs in the
foreground until SIGINT or SIGTERM, stops the emulators and exits 0. Exits
1 if an emulator dies on its own, 2 if they cannot start.

``python -m emulator end-streams SUBSCRIPTION...`` ends the streaming pulls
the running Pub/Sub emulator (``PUBSUB_EMULATOR_HOST``) still serves for
subscribers that are gone (:mod:`emulator.streams`); only while no
subscriber consumes them. Exits 1 if a subscription could not be reached,
2 without an emulator host.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from google.api_core.exceptions import GoogleAPICallError

from emulator.bootstrap import subscriber_admin
from emulator.emulators import DEFAULT_PROJECT, Emulators, start_emulators
from emulator.errors import EmulatorError
from emulator.names import subscription_path
from emulator.streams import end_streams
from emulator.topology import Topology, load_topology

__all__ = ["main"]

logger = logging.getLogger(__name__)

EXAMPLE_TOPOLOGY = Path(__file__).with_name("topology.example.toml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulator", description="Local Pub/Sub and Firestore emulators."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start both emulators in the foreground")
    up.add_argument("--project", default=DEFAULT_PROJECT, help="project id (%(default)s)")
    source = up.add_mutually_exclusive_group()
    source.add_argument(
        "--topology", type=Path, help=f"topology TOML file (default: {EXAMPLE_TOPOLOGY.name})"
    )
    source.add_argument("--no-topology", action="store_true", help="create no topics")
    up.add_argument(
        "--log-dir",
        type=Path,
        default=Path(".emulator", "logs"),
        help="folder for the emulators' logs (%(default)s)",
    )
    up.add_argument("--timeout", type=float, default=60.0, help="start-up limit, seconds")
    up.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")
    end = commands.add_parser(
        "end-streams",
        help="end the streams the Pub/Sub emulator serves for subscribers that are gone "
        "(only while no subscriber consumes)",
    )
    end.add_argument(
        "subscriptions",
        nargs="+",
        metavar="SUBSCRIPTION",
        help="projects/P/subscriptions/S, or S in --project",
    )
    end.add_argument(
        "--project", help="project of a bare subscription id (default $GOOGLE_CLOUD_PROJECT)"
    )
    end.add_argument("--host", help="the emulator's HOST:PORT (default $PUBSUB_EMULATOR_HOST)")
    return parser


def _print(line: str = "") -> None:
    print(line, flush=True)


def _describe(topology: Topology, emu: Emulators) -> None:
    made = emu.bootstrap(topology)
    for path in made.topics.values():
        _print(f"# topic {path}" + ("" if path in made.created else " (existed)"))
    for spec in topology.subscriptions:
        path = made.subscriptions[spec.name]
        traits = [f"ack deadline {spec.ack_deadline_seconds} s"]
        if spec.exactly_once:
            traits.append("exactly-once")
        if spec.push is not None:
            traits.append(f"push to {spec.push.endpoint}")
        if spec.dead_letter:
            traits.append(
                f"dead letter to {spec.dead_letter.topic} "
                f"after {spec.dead_letter.max_delivery_attempts}"
            )
        _print(f"# subscription {path} ({', '.join(traits)})")


def up(args: argparse.Namespace) -> int:
    """Run the ``up`` command; return the exit status."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        topology = None if args.no_topology else load_topology(args.topology or EXAMPLE_TOPOLOGY)
        emu = start_emulators(args.project, timeout_s=args.timeout, log_dir=args.log_dir)
    except EmulatorError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    with emu:
        try:
            if topology is not None:
                _describe(topology, emu)
        except GoogleAPICallError as exc:
            print(f"error: could not create the topology: {exc}", file=sys.stderr, flush=True)
            return 2
        for key, value in emu.env().items():
            _print(f"export {key}={shlex.quote(value)}")
        if emu.log_dir is not None:
            _print(f"# logs in {emu.log_dir}")
        times = ", ".join(f"{name} {s:.1f} s" for name, s in emu.ready_s.items())
        _print(f"ready in {emu.startup_s:.1f} s ({times}); Ctrl-C to stop")
        while not stop.wait(0.5):
            if not emu.alive():
                print("error: an emulator exited on its own:", file=sys.stderr)
                for name in emu.ready_s:
                    print(f"--- {name}\n{emu.log_tail(name)}", file=sys.stderr, flush=True)
                return 1
        _print(f"stopping ({signal.Signals(received[0]).name})")
    _print("stopped")
    return 0


def end_streams_command(args: argparse.Namespace) -> int:
    """Run the ``end-streams`` command; return the exit status."""
    host = args.host or os.environ.get("PUBSUB_EMULATOR_HOST")
    if not host:
        print(
            "error: end-streams needs the emulator's address: PUBSUB_EMULATOR_HOST or --host "
            "(it never talks to a real project)",
            file=sys.stderr,
        )
        return 2
    project = args.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or DEFAULT_PROJECT
    subscriber = subscriber_admin(host)
    failed = 0
    for name in args.subscriptions:
        path = name if name.startswith("projects/") else subscription_path(project, name)
        try:
            end_streams(subscriber, path)
        except GoogleAPICallError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr, flush=True)
            failed += 1
        else:
            _print(f"ended the streams of {path} at {host}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m emulator``; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "end-streams":
        return end_streams_command(args)
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
