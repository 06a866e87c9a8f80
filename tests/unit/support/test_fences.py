"""The switch that turns a fence off: parsed once, refused outside the emulators, announced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pubsub_worker._support import fences
from pubsub_worker.errors import ConfigError
from tests.support.processes import ROOT

EMULATED = {"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085", "FIRESTORE_EMULATOR_HOST": "127.0.0.1:8080"}


def test_the_fences_in_the_order_a_delivery_meets_them() -> None:
    assert fences.FENCES == (
        "generation",
        "adoption",
        "claim",
        "live-lease",
        "commit",
        "transaction",
        "durable-ack",
        "outbox",
        "review-mark",
        "expect-epoch",
    )


@pytest.mark.parametrize(
    ("value", "off"),
    [
        (None, frozenset()),
        ("", frozenset()),
        (" , ", frozenset()),
        ("commit", {"commit"}),
        (" outbox,commit ,outbox", {"commit", "outbox"}),
        (",".join(fences.FENCES), set(fences.FENCES)),
    ],
)
def test_the_variable_names_the_fences_switched_off(value: str | None, off: set[str]) -> None:
    environ = EMULATED if value is None else {**EMULATED, fences.ENV: value}
    assert fences.parse(environ) == off


def test_an_unknown_name_is_an_error_naming_the_variable_and_the_names() -> None:
    with pytest.raises(ConfigError) as caught:
        fences.parse({**EMULATED, fences.ENV: "commit,comit"})
    assert str(caught.value) == (
        "PUBSUB_WORKER_UNSAFE_DISABLE_FENCES='commit,comit': unknown fence(s) comit "
        "(accepted: comma-separated names among generation, adoption, claim, live-lease, "
        "commit, transaction, durable-ack, outbox, review-mark, expect-epoch)"
    )


@pytest.mark.parametrize(
    ("hosts", "missing"),
    [
        ({}, "PUBSUB_EMULATOR_HOST and FIRESTORE_EMULATOR_HOST"),
        ({"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"}, "FIRESTORE_EMULATOR_HOST"),
        ({"FIRESTORE_EMULATOR_HOST": "127.0.0.1:8080"}, "PUBSUB_EMULATOR_HOST"),
        ({**EMULATED, "PUBSUB_EMULATOR_HOST": ""}, "PUBSUB_EMULATOR_HOST"),
    ],
)
def test_switching_a_fence_off_is_refused_without_both_emulators(
    hosts: dict[str, str], missing: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        fences.parse({**hosts, fences.ENV: "commit"})
    assert str(caught.value) == (
        "PUBSUB_WORKER_UNSAFE_DISABLE_FENCES: refused: fences can only be switched off "
        f"against the emulators ({missing} not set)"
    )


@pytest.mark.parametrize(
    "host",
    [
        "unused",
        "placeholder:0",
        "localhost",
        "127.0.0.1:",
        "127.0.0.1:65536",
        "127.0.0.1:80a",
        "emulator:8085",
        "10.0.0.7:8085",
        "firestore.googleapis.com:443",
        "[2001:db8::1]:8085",
    ],
)
def test_a_placeholder_or_a_remote_host_is_not_an_emulator(host: str) -> None:
    """Set to anything, the variables would let a fence be switched off in production."""
    with pytest.raises(ConfigError) as caught:
        fences.parse({**EMULATED, "FIRESTORE_EMULATOR_HOST": host, fences.ENV: "commit"})
    assert str(caught.value) == (
        "PUBSUB_WORKER_UNSAFE_DISABLE_FENCES: refused: fences can only be switched off against "
        f"the emulators on this machine: FIRESTORE_EMULATOR_HOST={host!r} is not one "
        "(HOST:PORT, the host localhost, 127.0.0.1 (any 127.x.y.z) or [::1], the port 1-65535)"
    )


@pytest.mark.parametrize("host", ["127.0.0.1:8085", "localhost:1", "127.8.9.10:65535", "[::1]:80"])
def test_an_emulator_on_this_machine_is_one(host: str) -> None:
    environ = {**EMULATED, "PUBSUB_EMULATOR_HOST": host, fences.ENV: "commit"}
    assert fences.parse(environ) == {"commit"}


def test_every_fence_is_on_unless_a_test_switches_it_off() -> None:
    assert [name in fences.OFF for name in fences.FENCES] == [False] * len(fences.FENCES)


def test_disabled_switches_its_fences_off_for_the_block_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in EMULATED.items():
        monkeypatch.setenv(name, value)
    with fences.disabled("commit", "outbox"):
        with fences.disabled("claim"):
            assert {name for name in fences.FENCES if name in fences.OFF} == {
                "claim",
                "commit",
                "outbox",
            }
        assert {name for name in fences.FENCES if name in fences.OFF} == {"commit", "outbox"}
    assert [name in fences.OFF for name in fences.FENCES] == [False] * len(fences.FENCES)
    assert [r.getMessage() for r in caplog.records if r.name == "pubsub_worker"] == [
        f"UNSAFE: fence(s) {names} switched off (PUBSUB_WORKER_UNSAFE_DISABLE_FENCES): "
        "exactly-once processing is NOT guaranteed; this is for tests against the emulators only"
        for names in ("commit, outbox", "claim")
    ]


def test_disabled_is_refused_without_the_emulators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRESTORE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    with pytest.raises(ConfigError, match="refused: fences can only be switched off"):  # noqa: SIM117
        with fences.disabled("commit"):
            pytest.fail("the block ran")
    assert "commit" not in fences.OFF


def _start(value: str, **hosts: str) -> subprocess.CompletedProcess[str]:
    """A process that imports the library with ``value`` in the variable, then starts a
    worker's tracker (what a worker builds as it starts)."""
    env = {k: v for k, v in os.environ.items() if k not in fences.EMULATORS}
    code = (
        "import logging; logging.basicConfig(format='%(levelname)s %(message)s')\n"
        "from pubsub_worker._support import fences\n"
        "print(sorted(name for name in fences.FENCES if name in fences.OFF))\n"
        "from pubsub_worker._delivery.generations import DeliveryTracker\n"
        "DeliveryTracker()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, **hosts, fences.ENV: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_worker_started_with_a_fence_off_warns_naming_it() -> None:
    started = _start("outbox,generation", **EMULATED)
    assert started.returncode == 0, started.stderr
    assert started.stdout == "['generation', 'outbox']\n"
    # The one warning, once (the client libraries may warn about the Python version too).
    assert [line for line in started.stderr.splitlines() if "UNSAFE" in line] == [
        "WARNING UNSAFE: fence(s) generation, outbox switched off "
        "(PUBSUB_WORKER_UNSAFE_DISABLE_FENCES): exactly-once processing is NOT guaranteed; "
        "this is for tests against the emulators only"
    ]


def test_a_worker_outside_the_emulators_refuses_to_start_with_a_fence_off() -> None:
    started = _start("commit", PUBSUB_EMULATOR_HOST="127.0.0.1:8085")
    assert started.returncode == 1
    assert started.stdout == "[]\n"  # the import itself never fails; no fence is off
    assert started.stderr.splitlines()[-1] == (
        "pubsub_worker.errors.ConfigError: PUBSUB_WORKER_UNSAFE_DISABLE_FENCES: refused: "
        "fences can only be switched off against the emulators (FIRESTORE_EMULATOR_HOST not set)"
    )
