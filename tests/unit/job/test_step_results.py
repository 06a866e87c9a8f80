"""What a step returns is its result's JSON round trip, on its first run and when replayed.

A step's result is stored as JSON text; the value the handler gets back from
``job.step`` is what a later delivery would read from that text, so the two
never differ. Plain values whose round trip gives them back unchanged skip
the decode; these tests hold the fast path to what the encoder would have
made of them.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._job.records import MAX_RESULT_BYTES, StagedStep, encode
from pubsub_worker.errors import DocumentTooLarge, PermanentError
from tests.support.world import FakeMessage, World

_REFERENCE = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


class _Colour(enum.IntEnum):
    RED = 1


class _Name(str, enum.Enum):
    ADA = "ada"


VALUES = [
    None,
    True,
    False,
    0,
    -7,
    2**63,
    10**300,
    1.5,
    -0.0,
    1e300,
    "",
    "plain",
    "é\u2603",
    "\udcff lone surrogate",
    'quote " and \\ and \n',
    [1, "a", None],
    (1, 2),
    {"a": [1, {"b": None}]},
    _Colour.RED,
    _Name.ADA,
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_result_is_stored_as_the_encoder_writes_it(value: Any) -> None:
    assert encode("s", value) == _REFERENCE.encode(value)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_value_given_back_is_the_json_round_trip_of_the_result(value: Any) -> None:
    text = encode("s", value)
    back = StagedStep(text, [], False, value).value
    expected = json.loads(text)
    assert back == expected
    assert type(back) is type(expected)  # a tuple comes back a list, an IntEnum an int


_DIGITS_LIMIT = getattr(sys, "get_int_max_str_digits", lambda: 0)()
"""Python's limit on an int's decimal digits (0: none, as before 3.10.7, or switched off)."""


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        object(),
        {1, 2},
        pytest.param(
            10 ** (_DIGITS_LIMIT + 1),
            marks=pytest.mark.skipif(not _DIGITS_LIMIT, reason="no limit on an int's digits"),
        ),
        b"bytes",
    ],
    ids=["nan", "inf", "object", "set", "int-past-str-digits", "bytes"],
)
def test_a_result_that_is_not_json_is_a_permanent_error(value: Any) -> None:
    with pytest.raises(PermanentError, match="the result of step 's' is not JSON"):
        encode("s", value)


def test_a_result_over_the_limit_is_refused_counting_its_escaped_text() -> None:
    assert len(encode("s", "x" * (MAX_RESULT_BYTES - 2))) == MAX_RESULT_BYTES
    with pytest.raises(DocumentTooLarge):
        encode("s", "x" * (MAX_RESULT_BYTES - 1))
    # Under the limit in characters, over it once escaped (six bytes each): refused.
    with pytest.raises(DocumentTooLarge):
        encode("s", "\u2603" * (MAX_RESULT_BYTES // 5))


def _twice(value: Any) -> Callable[[Any, pubsub_worker.Job], None]:
    """A handler whose step ``one`` returns ``value``; its second step fails the first time."""
    seen: list[Any] = []
    failed: list[bool] = []

    def handler(message: Any, job: pubsub_worker.Job) -> None:
        seen.append(job.step("one", lambda: value))
        if not failed:
            failed.append(True)
            raise ConnectionError("the second step's service is down")
        job.step("two", lambda: None)

    handler.seen = seen  # type: ignore[attr-defined]
    return handler


@pytest.mark.parametrize("value", [7, "text", (1, "a"), _Colour.RED, {"k": [1.5]}], ids=repr)
def test_the_first_run_and_the_next_attempt_get_the_same_value(
    world: Callable[..., World], value: Any
) -> None:
    handler = _twice(value)
    w = world(handler)
    assert w.deliver(FakeMessage(op="k")) == "nack"  # retried: released for another attempt
    assert w.deliver(FakeMessage(op="k")) == "ack"  # step one answered from its record
    first, second = handler.seen  # type: ignore[attr-defined]
    assert first == second
    assert type(first) is type(second) is type(json.loads(_REFERENCE.encode(value)))
    assert w.record()["steps"]["one"]["result"] == _REFERENCE.encode(value)
