"""The public surface of the emulator package."""

from __future__ import annotations

import emulator


def test_all_is_sorted_and_complete() -> None:
    assert emulator.__all__ == sorted(emulator.__all__)
    assert all(hasattr(emulator, name) for name in emulator.__all__)
    assert set(emulator.__all__) == {
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
    }


def test_one_exception_tree() -> None:
    for name in (
        "EmulatorNotInstalled",
        "EmulatorStartError",
        "DockerUnavailable",
        "TopologyError",
        "PortInUse",
    ):
        assert issubclass(getattr(emulator, name), emulator.EmulatorError)
