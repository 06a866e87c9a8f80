"""Topology files and declarations: strict validation with field paths and lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import emulator
from emulator import (
    DeadLetterSpec,
    RetrySpec,
    SubscriptionSpec,
    TopicSpec,
    Topology,
    TopologyError,
    load_topology,
    parse_topology,
)
from emulator.pytest_plugin import MakeSubscription

VALID = """\
[[topics]]
name = "jobs"

[[topics]]
name = "jobs-dead"

[[subscriptions]]
name = "jobs-worker"
topic = "jobs"
exactly_once = true
ack_deadline_seconds = 30
dead_letter = { topic = "jobs-dead", max_delivery_attempts = 7 }
retry = { min_backoff_seconds = 0.5, max_backoff_seconds = 20 }

[[subscriptions]]
name = "jobs-audit"
topic = "jobs"
"""


def test_valid_file_parses_every_key() -> None:
    topology = parse_topology(VALID)
    assert topology.topics == (TopicSpec("jobs"), TopicSpec("jobs-dead"))
    worker = topology.subscription("jobs-worker")
    assert worker == SubscriptionSpec(
        name="jobs-worker",
        topic="jobs",
        exactly_once=True,
        ack_deadline_seconds=30,
        dead_letter=DeadLetterSpec("jobs-dead", 7),
        retry=RetrySpec(0.5, 20),
    )
    audit = topology.subscription("jobs-audit")
    assert (audit.exactly_once, audit.ack_deadline_seconds, audit.dead_letter) == (False, 10, None)


def test_ordering_is_read_and_off_by_default() -> None:
    text = VALID.replace("exactly_once = true", "exactly_once = true\nordering = true")
    topology = parse_topology(text)
    assert topology.subscription("jobs-worker").ordering is True
    assert topology.subscription("jobs-audit").ordering is False
    assert SubscriptionSpec("s-1", topic="jobs").ordering is False


def test_ordering_must_be_a_boolean() -> None:
    error = _error(VALID.replace("exactly_once = true", 'exactly_once = true\nordering = "yes"'))
    assert error.path == "subscriptions[0].ordering"
    assert error.line == 11
    assert "must be true or false, got 'yes'" in str(error)
    with pytest.raises(TopologyError) as info:
        Topology(
            topics=(TopicSpec("jobs"),),
            subscriptions=(SubscriptionSpec("w-1", topic="jobs", ordering=1),),  # type: ignore[arg-type]
        )
    assert info.value.path == "subscriptions[0].ordering"


def test_factory_creates_a_subscription_with_message_ordering(
    subscriber: Any, make_subscription: MakeSubscription
) -> None:
    ordered = make_subscription(exactly_once=True, ordering=True)
    plain = make_subscription(exactly_once=True)
    sub = subscriber.get_subscription(subscription=ordered.subscription_path)
    assert (sub.enable_message_ordering, sub.enable_exactly_once_delivery) == (True, True)
    sub = subscriber.get_subscription(subscription=plain.subscription_path)
    assert (sub.enable_message_ordering, sub.enable_exactly_once_delivery) == (False, True)


def test_bundled_example_is_valid() -> None:
    example = Path(emulator.__file__).with_name("topology.example.toml")
    topology = load_topology(example)
    worker = topology.subscription("jobs-worker")
    assert worker.exactly_once
    assert worker.dead_letter is not None


def _error(text: str) -> TopologyError:
    with pytest.raises(TopologyError) as info:
        parse_topology(text, source="topo.toml")
    return info.value


def test_unknown_key_names_path_and_line() -> None:
    error = _error(VALID.replace('name = "jobs-audit"', 'name = "jobs-audit"\nack_deadline = 10'))
    assert error.path == "subscriptions[1].ack_deadline"
    assert error.line == 17
    assert str(error).startswith("topo.toml:17: subscriptions[1].ack_deadline: unknown key")
    assert "ack_deadline_seconds" in str(error)  # lists what is allowed


def test_ack_deadline_out_of_range() -> None:
    error = _error(VALID.replace("ack_deadline_seconds = 30", "ack_deadline_seconds = 5"))
    assert error.path == "subscriptions[0].ack_deadline_seconds"
    assert error.line == 11
    assert "10 to 600" in str(error)


@pytest.mark.parametrize(
    ("old", "new", "path", "line"),
    [
        (
            "max_delivery_attempts = 7",
            "max_delivery_attempts = 101",
            "subscriptions[0].dead_letter.max_delivery_attempts",
            12,
        ),
        (
            "min_backoff_seconds = 0.5",
            "min_backoff_seconds = -1",
            "subscriptions[0].retry.min_backoff_seconds",
            13,
        ),
        ("max_backoff_seconds = 20", "max_backoff_seconds = 0.1", None, 13),
        (
            'name = "jobs-audit"\ntopic = "jobs"',
            'name = "jobs-audit"\ntopic = "nope"',
            "subscriptions[1].topic",
            17,
        ),
        ('{ topic = "jobs-dead"', '{ topic = "ghost"', "subscriptions[0].dead_letter.topic", 12),
        ('name = "jobs-audit"', 'name = "jobs-worker"', "subscriptions[1].name", 16),
        ('name = "jobs-dead"', 'name = "goog-dead"', "topics[1].name", 5),
        ("exactly_once = true", 'exactly_once = "yes"', "subscriptions[0].exactly_once", 10),
        ("ack_deadline_seconds = 30", "ack_deadline_seconds = 30.5", None, 11),
    ],
)
def test_bad_values_name_their_field(old: str, new: str, path: str | None, line: int) -> None:
    assert old in VALID
    error = _error(VALID.replace(old, new, 1))
    if path is not None:
        assert error.path == path
    assert error.line == line
    assert str(error).startswith(f"topo.toml:{line}: {error.path}: ")


def test_subtable_form_is_located_too() -> None:
    text = VALID.replace(
        'dead_letter = { topic = "jobs-dead", max_delivery_attempts = 7 }\n', ""
    ).replace(
        '[[subscriptions]]\nname = "jobs-audit"',
        '[subscriptions.dead_letter]\ntopic = "jobs-dead"\nmax_delivery_attempts = 2\n\n'
        '[[subscriptions]]\nname = "jobs-audit"',
    )
    error = _error(text)
    assert error.path == "subscriptions[0].dead_letter.max_delivery_attempts"
    assert text.splitlines()[error.line - 1] == "max_delivery_attempts = 2"  # type: ignore[operator]


def test_missing_required_key_and_wrong_shapes() -> None:
    assert _error('[[subscriptions]]\nname = "abc"\n').path == "subscriptions[0]"
    assert _error('topics = "jobs"\n').path == "topics"
    assert _error('[[topics]]\nname = "jobs"\n[extra]\nx = 1\n').path == "extra"


def test_invalid_toml_reports_the_line() -> None:
    error = _error('[[topics]]\nname = "jobs"\nname2 = \n')
    assert error.line == 3
    assert "not valid TOML" in str(error)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.toml")


def test_python_declarations_are_validated_with_paths() -> None:
    with pytest.raises(TopologyError) as info:
        Topology(
            topics=(TopicSpec("jobs"),),
            subscriptions=(SubscriptionSpec("w-1", topic="jobs", retry=RetrySpec(5, 1)),),
        )
    assert info.value.path == "subscriptions[0].retry.min_backoff_seconds"
    with pytest.raises(TopologyError, match=r"topics\[0\].name"):
        Topology(topics=(TopicSpec("x"),))
    ok = Topology(topics=[TopicSpec("jobs")])  # type: ignore[arg-type]
    assert ok.topics == (TopicSpec("jobs"),)
    assert hash(ok) == hash(Topology(topics=(TopicSpec("jobs"),)))


def test_cli_rejects_a_bad_file_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(VALID.replace("max_delivery_attempts = 7", "max_delivery_attempts = 3"))
    result = subprocess.run(
        [sys.executable, "-m", "emulator", "up", "--topology", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}:12: subscriptions[0].dead_letter.max_delivery_attempts" in result.stderr
    assert "from 5 to 100, got 3" in result.stderr
    assert "ready in" not in result.stdout
