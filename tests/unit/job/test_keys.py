"""Keys are hostile input: document ids never contain them raw."""

import hashlib
import re

import pytest

from pubsub_worker._job.keys import REPLAY_OF_ATTRIBUTE, derive_identity, display, document_id
from pubsub_worker.errors import InvalidMessage

SUB = "projects/p/subscriptions/s"
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.mark.parametrize(
    "key",
    ["a/b/c", "..", ".", "__name__", "x" * 2048, "\udcff\udcfe", "", "ключ", "a\0b"],
    ids=lambda key: ascii(key)[:40],  # lone surrogates cannot travel to pytest-xdist workers
)
def test_document_ids_are_hex_digests_whatever_the_key(key: str) -> None:
    doc_id = document_id(SUB, key)
    assert HEX64.match(doc_id)
    assert doc_id == document_id(SUB, key)  # stable


@pytest.mark.parametrize("key", ["k", "a/b", "\udcff", "x" * 300])
@pytest.mark.parametrize("namespace", ["job", "rejected"])
def test_document_ids_are_the_documented_digest(namespace: str, key: str) -> None:
    """SHA-256 of the namespace, the subscription and the key, each preceded by its length in
    8 bytes, as the module documents: cached or not, every process finds a job at one id."""
    expected = hashlib.sha256()
    for part in (namespace, SUB, key):
        raw = part.encode("utf-8", "surrogatepass")
        expected.update(len(raw).to_bytes(8, "big") + raw)
    for _ in range(2):  # the second time from the subscription's cached prefix
        assert document_id(SUB, key, namespace=namespace) == expected.hexdigest()


def test_namespacing_separates_subscriptions_and_record_kinds() -> None:
    assert document_id(SUB, "k") != document_id("projects/p/subscriptions/other", "k")
    assert document_id(SUB, "k") != document_id(SUB, "k", namespace="rejected")
    # length-prefixed parts: moving a boundary never collides
    assert document_id("ab", "c") != document_id("a", "bc")


def test_key_attribute_is_used_and_a_missing_one_is_an_error() -> None:
    identity = derive_identity(
        subscription=SUB, message_id="m1", attributes={"op": "op-7"}, data=b"x", key_attribute="op"
    )
    assert identity.key == "op-7"
    with pytest.raises(InvalidMessage, match="missing"):
        derive_identity(
            subscription=SUB, message_id="m1", attributes={}, data=b"x", key_attribute="op"
        )
    with pytest.raises(InvalidMessage, match="empty"):
        derive_identity(
            subscription=SUB, message_id="m1", attributes={"op": ""}, data=b"x", key_attribute="op"
        )


def test_without_key_attribute_the_message_id_is_the_key_unless_replayed() -> None:
    plain = derive_identity(
        subscription=SUB, message_id="m1", attributes={}, data=b"x", key_attribute=None
    )
    assert plain.key == "m1"
    replayed = derive_identity(
        subscription=SUB,
        message_id="m2",
        attributes={REPLAY_OF_ATTRIBUTE: "m1"},
        data=b"x",
        key_attribute=None,
    )
    assert replayed.doc_id == plain.doc_id


def test_payload_digest_distinguishes_payloads() -> None:
    one = derive_identity(
        subscription=SUB, message_id="m", attributes={}, data=b"a", key_attribute=None
    )
    two = derive_identity(
        subscription=SUB, message_id="m", attributes={}, data=b"b", key_attribute=None
    )
    assert one.payload_sha256 != two.payload_sha256


def test_display_is_valid_utf8_and_bounded() -> None:
    shown = display("\udcff" + "é" * 2000, 100)
    shown.encode("utf-8")  # does not raise
    assert len(shown.encode()) <= 100 + len("…".encode())
    assert shown.endswith("…")
