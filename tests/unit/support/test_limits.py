"""Production's limits: boundaries of every Pub/Sub message limit and Firestore's storage sizes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from pubsub_worker._support import limits
from pubsub_worker.errors import LimitExceeded, PermanentError


def attrs(count: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(count)}


# -- attribute_problem ----------------------------------------------------------------


def test_constants_are_productions() -> None:
    assert limits.MAX_ATTRIBUTES == 100
    assert limits.MAX_ATTRIBUTE_KEY_BYTES == 256
    assert limits.MAX_ATTRIBUTE_VALUE_BYTES == 1024
    assert limits.MAX_MESSAGE_BYTES == 10_000_000
    assert limits.RESERVED_KEY_PREFIX == "goog"
    assert limits.MAX_DOCUMENT_BYTES == 1_048_576


def test_key_of_256_bytes_is_allowed_257_is_not() -> None:
    assert limits.attribute_problem("k" * 256, "v") is None
    problem = limits.attribute_problem("k" * 257, "v")
    assert problem is not None
    assert "257 bytes" in problem
    assert "at most 256" in problem


def test_key_length_is_counted_in_utf8_bytes() -> None:
    # "é" is 2 bytes: 128 of them are 256 bytes (allowed) in only 128 characters.
    assert limits.attribute_problem("é" * 128, "v") is None
    assert limits.attribute_problem("é" * 128 + "k", "v") is not None
    # "€" is 3 bytes: 85 are 255 bytes, 86 are 258 bytes.
    assert limits.attribute_problem("€" * 85 + "k", "v") is None
    assert limits.attribute_problem("€" * 86, "v") is not None


def test_value_of_1024_bytes_is_allowed_1025_is_not() -> None:
    assert limits.attribute_problem("k", "v" * 1024) is None
    assert limits.attribute_problem("k", "é" * 512) is None
    problem = limits.attribute_problem("k", "v" * 1025)
    assert problem is not None
    assert "1025 bytes" in problem
    assert limits.attribute_problem("k", "é" * 512 + "v") is not None


def test_empty_value_is_allowed() -> None:
    assert limits.attribute_problem("k", "") is None


def test_empty_key_is_not_allowed() -> None:
    assert limits.attribute_problem("", "v") == "attribute key is empty"


def test_goog_prefix_is_reserved() -> None:
    for key in ("goog", "google", "goog_x", "googlers"):
        problem = limits.attribute_problem(key, "v")
        assert problem is not None
        assert "reserved prefix 'goog'" in problem
    # Only a prefix is reserved, and it is compared as written.
    for key in ("xgoog", "go", "gog", "Goog", "a_goog"):
        assert limits.attribute_problem(key, "v") is None


def test_lone_surrogates_are_measured_not_a_crash() -> None:
    # A lone surrogate is 3 bytes with surrogatepass.
    assert limits.attribute_problem("\ud800" * 85, "\udfff" * 341) is None
    assert limits.attribute_problem("\ud800" * 86, "v") is not None
    assert limits.attribute_problem("k", "\udfff" * 342) is not None
    assert limits.message_bytes(b"", {"\ud800": "\udfff"}) == 6


def test_hostile_key_is_shown_clipped_and_escaped() -> None:
    problem = limits.attribute_problem("goog\nERROR forged" + "x" * 1000, "v")
    assert problem is not None
    assert "\n" not in problem
    assert "\\n" in problem
    assert len(problem) < 200


# -- problems and check_message --------------------------------------------------------


def test_100_attributes_are_allowed_101_are_not() -> None:
    assert limits.problems(b"d", attrs(100)) == []
    assert limits.problems(b"d", attrs(101)) == ["101 attributes; at most 100 are allowed"]


def test_message_size_counts_data_keys_and_values() -> None:
    assert limits.message_bytes(b"abc", {"ké": "vé€"}) == 3 + 3 + 6
    assert limits.message_bytes(b"", {}) == 0


def test_10_mb_message_is_allowed_one_byte_more_is_not() -> None:
    attributes = {"key": "value"}  # 8 bytes
    data = b"x" * (limits.MAX_MESSAGE_BYTES - 8)
    assert limits.message_bytes(data, attributes) == 10_000_000
    assert limits.problems(data, attributes) == []
    found = limits.problems(data + b"x", attributes)
    assert found == [
        "message is 10000001 bytes (data and attributes); at most 10000000 are allowed"
    ]


def test_message_without_data_or_attributes_is_not_allowed() -> None:
    assert limits.problems(b"", {}) == ["message has neither data nor attributes"]
    assert limits.problems(b"", {"k": "v"}) == []
    assert limits.problems(b"d", {}) == []


def test_problems_lists_every_broken_limit() -> None:
    attributes = {**attrs(99), "": "v", "goog_x": "v", "big": "v" * 1025}
    found = limits.problems(b"d", attributes)
    assert len(found) == 4
    assert found[0] == "102 attributes; at most 100 are allowed"
    assert found[1] == "attribute key is empty"
    assert "goog" in found[2]
    assert "'big'" in found[3]


def test_check_message_passes_a_valid_message() -> None:
    limits.check_message(b"d", attrs(100))


def test_check_message_raises_limit_exceeded_naming_the_problem() -> None:
    with pytest.raises(LimitExceeded, match="101 attributes; at most 100") as caught:
        limits.check_message(b"d", attrs(101))
    assert isinstance(caught.value, PermanentError)
    assert isinstance(caught.value, ValueError)


def test_check_message_names_a_few_problems_and_counts_the_rest() -> None:
    attributes = {f"goog{i}": "v" for i in range(50)}
    with pytest.raises(LimitExceeded) as caught:
        limits.check_message(b"d", attributes)
    text = str(caught.value)
    assert text.count("reserved prefix") == 5
    assert text.endswith("; and 45 more")


# -- fit_attributes --------------------------------------------------------------------


def test_fit_keeps_valid_attributes_in_order_up_to_the_room_left() -> None:
    attributes = attrs(100)
    kept, left_out = limits.fit_attributes(attributes, reserved=6)
    assert list(kept) == [f"k{i}" for i in range(94)]
    assert list(left_out) == [f"k{i}" for i in range(94, 100)]
    assert kept | left_out == attributes


def test_fit_leaves_out_invalid_attributes_without_using_room() -> None:
    attributes = {"a": "1", "": "empty", "goog_x": "2", "b": "v" * 1025, "c": "3", "d": "4"}
    kept, left_out = limits.fit_attributes(attributes, reserved=limits.MAX_ATTRIBUTES - 2)
    assert kept == {"a": "1", "c": "3"}
    assert list(left_out) == ["", "goog_x", "b", "d"]


def test_fit_with_everything_reserved_keeps_nothing() -> None:
    kept, left_out = limits.fit_attributes({"a": "1"}, reserved=100)
    assert kept == {}
    assert left_out == {"a": "1"}
    kept, left_out = limits.fit_attributes(attrs(100), reserved=0)
    assert len(kept) == 100
    assert left_out == {}


def test_fit_result_with_reserved_attributes_passes_the_check() -> None:
    attributes = {**attrs(150), "goog": "x", "k" * 300: "v"}
    kept, _ = limits.fit_attributes(attributes, reserved=3)
    own = {"pubsub_worker_reason": "r", "pubsub_worker_error": "e", "pubsub_worker_key": "k"}
    limits.check_message(b"d", {**kept, **own})


@pytest.mark.parametrize("reserved", [-1, 101])
def test_fit_rejects_reserved_out_of_range(reserved: int) -> None:
    with pytest.raises(ValueError, match="reserved"):
        limits.fit_attributes({}, reserved=reserved)


# -- document_bytes --------------------------------------------------------------------


def test_empty_document_is_its_overhead() -> None:
    assert limits.document_bytes({}) == 32


def test_scalar_sizes() -> None:
    # Each field: name "f" (1 + 1 bytes) plus the value's size, plus 32 for the document.
    def field(value: object) -> int:
        return limits.document_bytes({"f": value}) - 32 - 2

    assert field("") == 1
    assert field("abc") == 4
    assert field("é€") == 6
    assert field("\ud800") == 4
    assert field(b"abc") == 3
    assert field(b"") == 0
    assert field(0) == 8
    assert field(2**63 - 1) == 8
    assert field(1.5) == 8
    assert field(datetime(2026, 1, 1, tzinfo=timezone.utc)) == 8
    assert field(True) == 1
    assert field(False) == 1
    assert field(None) == 1


def test_maps_and_arrays() -> None:
    # Firestore's documented example: a task document.
    task = {
        "type": "Personal",  # 5 + 9
        "done": False,  # 5 + 1
        "priority": 1,  # 9 + 8
        "description": "Learn Cloud Firestore",  # 12 + 22
    }
    assert limits.document_bytes(task) == 14 + 6 + 17 + 34 + 32
    nested = {"m": {"a": "x", "b": [1, "yz", None], "c": {}}, "arr": []}
    # m: 2 + (a: 2 + 2) + (b: 2 + 8 + 3 + 1) + (c: 2 + 0); arr: 4 + 0
    assert limits.document_bytes(nested) == 2 + 4 + 14 + 2 + 4 + 32


def test_firestore_value_types_by_shape() -> None:
    @dataclass
    class GeoPoint:
        latitude: float
        longitude: float

    @dataclass
    class Reference:
        path: str

    assert limits.document_bytes({"g": GeoPoint(1.0, 2.0)}) == 2 + 16 + 32
    # "users/jeff": (6 + 5) + 16
    assert limits.document_bytes({"r": Reference("users/jeff")}) == 2 + 27 + 32


def test_unknown_value_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="object"):
        limits.document_bytes({"f": object()})


def test_a_document_at_the_limit() -> None:
    # One bytes field sized so the document is exactly 1 MiB.
    data = b"x" * (limits.MAX_DOCUMENT_BYTES - 32 - 5)
    assert limits.document_bytes({"data": data}) == limits.MAX_DOCUMENT_BYTES
