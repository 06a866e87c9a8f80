"""Idempotency and effect keys are stable and unambiguous."""

from __future__ import annotations

from pubsub_worker._job.outbox import escape as _escape


def test_plain_keys_and_steps_are_unchanged() -> None:
    assert _escape("order-7") == "order-7"


def test_separator_inside_a_key_cannot_forge_another_pair() -> None:
    one = f"{_escape('a:b')}:{_escape('c')}"
    two = f"{_escape('a')}:{_escape('b:c')}"
    assert one != two
    assert _escape("50%:x") == "50%25%3Ax"  # the escape itself is escaped
