"""The real Google Pub/Sub and Firestore emulators, for tests and local development.

>>> from emulator import start_emulators, load_topology
>>> with start_emulators() as emu:                        # doctest: +SKIP
...     emu.export_env()
...     emu.bootstrap(load_topology("topology.toml"))

Command line: ``python -m emulator up``. pytest fixtures: :mod:`emulator.pytest_plugin`.
Fault injection: :class:`TcpProxy`. Pulling a subscription until it stays
quiet: :func:`drain_messages`. Ending the streams the emulator still serves for
subscribers that are gone: :func:`end_streams`.
"""

from emulator.bootstrap import (
    Bootstrapped,
    SubscriptionHandle,
    bootstrap,
    create_subscription,
    delete_subscription,
    set_push,
)
from emulator.components import Components, find_components
from emulator.docker import docker_available
from emulator.drain import drain_messages
from emulator.emulators import Backend, Emulators, start_emulators
from emulator.errors import (
    DockerUnavailable,
    EmulatorError,
    EmulatorNotInstalled,
    EmulatorStartError,
    PortInUse,
    TopologyError,
)
from emulator.faults import TcpProxy
from emulator.names import subscription_path, topic_path, unique_id
from emulator.streams import end_streams
from emulator.topology import (
    DeadLetterSpec,
    PushSpec,
    RetrySpec,
    SubscriptionSpec,
    TopicSpec,
    Topology,
    load_topology,
    parse_topology,
)

__all__ = [
    "Backend",
    "Bootstrapped",
    "Components",
    "DeadLetterSpec",
    "DockerUnavailable",
    "EmulatorError",
    "EmulatorNotInstalled",
    "EmulatorStartError",
    "Emulators",
    "PortInUse",
    "PushSpec",
    "RetrySpec",
    "SubscriptionHandle",
    "SubscriptionSpec",
    "TcpProxy",
    "TopicSpec",
    "Topology",
    "TopologyError",
    "bootstrap",
    "create_subscription",
    "delete_subscription",
    "docker_available",
    "drain_messages",
    "end_streams",
    "find_components",
    "load_topology",
    "parse_topology",
    "set_push",
    "start_emulators",
    "subscription_path",
    "topic_path",
    "unique_id",
]
