"""Text that is not valid UTF-8: escaped where the library writes it, refused where it names.

A file name from ``os.fsdecode`` of non-UTF-8 bytes holds a lone surrogate
(``"\\udcff"``), which neither Firestore nor Pub/Sub accepts. The store and
publisher here refuse such text exactly as the real clients do (the client
raises ``UnicodeEncodeError`` building the request), so a write boundary that
forgets to escape fails these tests as it would fail in production.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import pytest

import pubsub_worker
from pubsub_worker._job import records
from pubsub_worker._job.failure import FailurePath, rejected_document_id
from pubsub_worker._job.keys import document_id
from pubsub_worker._job.outbox import Outgoing, check_outgoing, effect_key
from pubsub_worker._job.records import check_step_name, encodable_text, unencodable_at
from pubsub_worker._support.metrics import Metrics
from pubsub_worker.errors import LimitExceeded, PermanentError
from pubsub_worker.stores import MemoryJobStore
from pubsub_worker.stores import base as s
from tests.support.world import FakeMessage

SUB = "projects/p/subscriptions/jobs"
FAILURES = "projects/p/topics/failures"
OUTPUT = "projects/p/topics/output"

NAME = os.fsdecode(b"report-\xff.csv")
"""A file name as ``os.fsdecode`` gives it for undecodable bytes: ``report-\\udcff.csv``."""
ESCAPED = "report-\\udcff.csv"
"""The same name made valid UTF-8: the surrogate as visible text, nothing dropped."""


def strict_utf8(value: Any) -> None:
    """Raise ``UnicodeEncodeError`` like the Firestore and Pub/Sub clients for invalid text."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, Mapping):
        for name, item in value.items():
            strict_utf8(name)
            strict_utf8(item)
    elif isinstance(value, list | tuple):
        for item in value:
            strict_utf8(item)


class StrictStore(MemoryJobStore):
    """The in-memory store, refusing what Firestore refuses: text that is not valid UTF-8."""

    def create(self, doc_id: str, fields: Mapping[str, Any]) -> s.Version:
        strict_utf8(fields)
        return super().create(doc_id, fields)

    def update(self, doc_id: str, changes: s.Changes, *, expected: s.Version) -> s.Version:
        for path, value in changes.items():
            strict_utf8(list(path))
            strict_utf8(value)
        return super().update(doc_id, changes, expected=expected)


class StrictPublisher:
    """Resolves every publish at once; raises at the call, as the client does, for bad text."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    def publish(self, topic: str, data: bytes, **attributes: str) -> Future[str]:
        strict_utf8([topic, attributes])
        self.sent.append((topic, data, attributes))
        future: Future[str] = Future()
        future.set_result(str(len(self.sent)))
        return future


class World:
    """A wrapper around ``handler`` on a strict store and publisher."""

    def __init__(self, handler: Any, **settings: Any) -> None:
        self.store = StrictStore()
        self.publisher = StrictPublisher()
        options = {
            "subscription": SUB,
            "key_attribute": "op",
            "lease_seconds": 10,
            "max_attempts": 3,
            "failure_topic": FAILURES,
            **settings,
        }
        self.wrapped = pubsub_worker.exactly_once(
            handler,
            settings=pubsub_worker.Settings(**options),
            store=self.store,
            publisher=self.publisher,
        )
        self.wrapped.start(check_subscription=False)

    def deliver(self, message: FakeMessage) -> str:
        self.wrapped(message)
        assert self.wrapped.wait_concluded(10)
        return message.outcome

    def record(self, key: str = "k") -> dict[str, Any]:
        snap = self.store.get(document_id(SUB, key))
        assert snap is not None
        return snap.fields

    def sent_to(self, topic: str) -> list[dict[str, str]]:
        return [attrs for to, _, attrs in self.publisher.sent if to == topic]


@pytest.fixture
def world() -> Iterator[Any]:
    made: list[World] = []

    def make(handler: Any, **settings: Any) -> World:
        made.append(World(handler, **settings))
        return made[-1]

    yield make
    for w in made:
        w.wrapped.close()


# -- the escaping function --------------------------------------------------------


def test_a_lone_surrogate_becomes_visible_text_and_nothing_is_dropped() -> None:
    assert NAME == "report-\udcff.csv"
    assert encodable_text(NAME) == ESCAPED
    assert encodable_text("a\ud800b\udfffc") == "a\\ud800b\\udfffc"
    encodable_text(f"bad file {NAME} ключ 😀").encode("utf-8")  # strict: no error


@pytest.mark.parametrize("text", ["", "plain", "ключ € 😀", "already \\udcff escaped", "a\0b"])
def test_valid_text_is_returned_unchanged(text: str) -> None:
    assert encodable_text(text) == text


def test_escaping_twice_changes_nothing_more() -> None:
    once = encodable_text(NAME)
    assert encodable_text(once) == once


def test_unencodable_at_names_the_first_lone_surrogate() -> None:
    assert unencodable_at("ab\udcffc\udcfe") == 2
    assert unencodable_at("ключ 😀") is None
    assert unencodable_at("") is None


# -- refused where the text names something -----------------------------------------


def test_a_step_name_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(ValueError, match="not valid UTF-8") as raised:
        check_step_name(f"upload {NAME}")
    str(raised.value).encode("utf-8")  # the error itself can be stored


@pytest.mark.parametrize("name", ["", "x" * 257, "é" * 129, b"bytes", None, ["a"], f"a{NAME}"])
def test_a_bad_step_name_is_refused_every_time_it_is_given(name: Any) -> None:
    for _ in range(2):  # a refused name is never taken for a checked one
        with pytest.raises(ValueError, match="step name"):
            check_step_name(name)


def test_valid_step_names_are_checked_once_and_the_memory_of_them_is_bounded() -> None:
    check_step_name("x" * 256)
    check_step_name("é" * 128)
    for n in range(records._VALID_NAMES_KEPT * 2):
        check_step_name(f"made per job {n}")
    assert 0 < len(records._VALID_NAMES) <= records._VALID_NAMES_KEPT


def test_a_step_named_with_a_lone_surrogate_never_runs_and_its_error_is_recorded(
    world: Any,
) -> None:
    runs: list[int] = []

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step(f"upload {NAME}", lambda: runs.append(1))

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    assert runs == []
    record = w.record()
    assert (record["status"], record["attempts"]) == ("released", 1)
    assert record["error"].startswith("ValueError: step name 'upload report-\\udcff.csv'")
    assert not record.get("steps")


@pytest.mark.parametrize(
    ("topic", "attributes", "what"),
    [
        (OUTPUT, {"file": NAME}, "value of attribute 'file'"),
        (OUTPUT, {NAME: "x"}, "attribute key"),
        (f"projects/p/topics/{NAME}", {}, "topic"),
    ],
    ids=["value", "key", "topic"],
)
def test_an_outbox_message_with_a_lone_surrogate_is_refused_when_published(
    topic: str, attributes: dict[str, str], what: str
) -> None:
    with pytest.raises(LimitExceeded, match="not valid UTF-8") as raised:
        check_outgoing(Outgoing(topic, b"data", attributes), "effect_key")
    assert what in str(raised.value)
    str(raised.value).encode("utf-8")


def test_an_effect_key_of_a_key_with_a_lone_surrogate_is_a_hash_apart_from_its_escape() -> None:
    hashed = effect_key(f"k{NAME}", "produce", 0)
    escaped = effect_key(f"k{ESCAPED}", "produce", 0)
    assert hashed.startswith("sha256:")
    assert len(hashed) == len("sha256:") + 64
    assert escaped == f"k{ESCAPED}:produce:0"  # valid keys keep their readable form
    assert effect_key(f"k{NAME}", "produce", 0) == hashed  # stable across redeliveries
    assert effect_key("k\udcfe", "produce", 0) != effect_key("k\udcff", "produce", 0)


def test_job_publish_refuses_an_attribute_with_a_lone_surrogate_and_nothing_is_sent(
    world: Any,
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("produce", lambda: job.publish(OUTPUT, b"out", file=NAME))

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    assert w.sent_to(OUTPUT) == []
    record = w.record()
    assert (record["status"], record["reason"], record["attempts"]) == ("failed", "limits", 1)
    assert "value of attribute 'file'" in record["error"]
    assert "not valid UTF-8" in record["error"]
    assert not record.get("outbox")
    (review,) = w.sent_to(FAILURES)
    assert review["pubsub_worker_reason"] == "limits"


def test_a_key_with_a_lone_surrogate_publishes_its_outbox_entry_under_a_hashed_effect_key(
    world: Any,
) -> None:
    key = f"k{NAME}"

    def handle(message: Any, job: pubsub_worker.Job) -> None:
        job.step("produce", lambda: job.publish(OUTPUT, b"out", source="test"))

    w = world(handle)
    assert w.deliver(FakeMessage(op=key)) == "ack"
    (published,) = w.sent_to(OUTPUT)
    assert published["effect_key"] == effect_key(key, "produce", 0)
    assert published["effect_key"].startswith("sha256:")
    assert w.record(key)["status"] == "completed"


# -- escaped where the library writes it ---------------------------------------------


def test_a_permanent_error_with_a_lone_surrogate_is_reviewed_once_with_the_escaped_text(
    world: Any,
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        raise PermanentError(f"bad file {NAME}")

    w = world(handle)
    assert w.deliver(FakeMessage(op="k")) == "ack"
    record = w.record()
    assert (record["status"], record["reason"], record["attempts"]) == ("failed", "permanent", 1)
    assert record["error"] == f"PermanentError: bad file {ESCAPED}"
    (review,) = w.sent_to(FAILURES)
    assert review["pubsub_worker_error"] == f"PermanentError: bad file {ESCAPED}"
    assert review["pubsub_worker_attempts"] == "1"


def test_an_error_with_a_lone_surrogate_is_released_counted_then_reviewed_once(
    world: Any,
) -> None:
    def handle(message: Any, job: pubsub_worker.Job) -> None:
        raise RuntimeError(f"bad file {NAME}")

    w = world(handle, max_attempts=2)
    assert w.deliver(FakeMessage(op="k")) == "nack"
    record = w.record()
    assert (record["status"], record["attempts"]) == ("released", 1)
    assert record["error"] == f"RuntimeError: bad file {ESCAPED}"
    assert w.deliver(FakeMessage(op="k")) == "ack"
    record = w.record()
    assert (record["status"], record["reason"], record["attempts"]) == ("failed", "attempts", 2)
    assert record["error"] == f"RuntimeError: bad file {ESCAPED}"
    (review,) = w.sent_to(FAILURES)
    assert review["pubsub_worker_error"] == f"RuntimeError: bad file {ESCAPED}"


def failure_path(store: StrictStore, publisher: StrictPublisher) -> FailurePath:
    return FailurePath(
        store=store,
        subscription=SUB,
        publish=lambda topic, data, attrs: publisher.publish(topic, data, **attrs),
        failure_topic=FAILURES,
        metrics=Metrics(),
        retention_s=3600.0,
        io_timeout_s=5.0,
    )


def test_a_rejected_message_s_record_and_failure_message_hold_escaped_text() -> None:
    """The record of a message that never became a job, and its failure message: the
    error, the key and the original attributes escaped, every attribute kept."""
    store, publisher = StrictStore(), StrictPublisher()
    failure_path(store, publisher).send(
        message_id="m-1",
        data=b"payload",
        attributes={"file": NAME, NAME: "named by a file"},
        key=f"k{NAME}",
        reason="missing_key",
        error=f"no key for {NAME}",
        job=None,
    )
    snap = store.get(rejected_document_id(SUB, "m-1"))
    assert snap is not None
    record = snap.fields
    assert (record[s.STATUS], record[s.REASON]) == ("failed", "missing_key")
    assert record[s.ERROR] == f"no key for {ESCAPED}"
    assert json.loads(record[s.ATTRIBUTES]) == {"file": ESCAPED, ESCAPED: "named by a file"}
    assert record[s.DATA] == b"payload"
    ((topic, data, review),) = publisher.sent
    assert (topic, data) == (FAILURES, b"payload")
    assert review["file"] == ESCAPED
    assert review[ESCAPED] == "named by a file"
    assert review["pubsub_worker_error"] == f"no key for {ESCAPED}"
    assert review["pubsub_worker_key"] == f"k{ESCAPED}"
    assert "pubsub_worker_attributes_left_out" not in review


def test_the_review_message_attributes_are_escaped_not_replaced() -> None:
    path = failure_path(StrictStore(), StrictPublisher())
    review = path.review_message(
        "m-1", b"x", {"file": NAME}, f"k{NAME}", "permanent", f"bad file {NAME}", 1
    )
    assert review is not None
    assert review["file"] == ESCAPED
    assert review["pubsub_worker_error"] == f"bad file {ESCAPED}"
    assert review["pubsub_worker_key"] == f"k{ESCAPED}"
    assert "\ufffd" not in "".join(review.values())
