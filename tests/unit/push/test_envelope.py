"""Every push request shape read into the stock client's message fields, and malformed ones."""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_worker.push.envelope import MESSAGE_PUBLISHED, Malformed, from_cloud_event_data, parse
from pubsub_worker.push.message import PushMessage, Shape

SUB = "projects/orders-demo/subscriptions/orders-push"
PUBLISHED = "2026-12-01T09:35:32.123456789Z"


def wrapped(**message: Any) -> dict[str, Any]:
    fields = {
        "data": base64.b64encode(b'{"order_id": "o-1"}').decode(),
        "attributes": {"order_id": "o-1"},
        "messageId": "1001",
        "publishTime": PUBLISHED,
        **message,
    }
    return {"message": {k: v for k, v in fields.items() if v is not None}, "subscription": SUB}


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


def check_message(message: PushMessage, shape: str) -> None:
    assert message.shape == shape
    assert message.message_id == "1001"
    assert message.data == b'{"order_id": "o-1"}'
    assert dict(message.attributes) == {"order_id": "o-1"}
    assert message.publish_time == datetime.datetime(
        2026, 12, 1, 9, 35, 32, 123457, tzinfo=datetime.timezone.utc
    )
    assert message.subscription == SUB


def test_the_wrapped_envelope() -> None:
    message = parse({"content-type": "application/json"}, body(wrapped()))
    check_message(message, Shape.WRAPPED)
    assert message.ordering_key == ""
    assert message.delivery_attempt is None
    assert message.exactly_once_enabled is False
    assert message.ack_id.startswith("push:")


def test_the_wrapped_envelope_with_snake_case_fields_as_the_emulator_sends_too() -> None:
    envelope = wrapped(messageId=None, publishTime=None, message_id="1001", publish_time=PUBLISHED)
    check_message(parse({}, body(envelope)), Shape.WRAPPED)


def test_ordering_key_and_delivery_attempt() -> None:
    envelope = {**wrapped(orderingKey="customer-7"), "deliveryAttempt": 3}
    message = parse({}, body(envelope))
    assert message.ordering_key == "customer-7"
    assert message.delivery_attempt == 3


def test_empty_data_and_no_attributes() -> None:
    message = parse({}, body(wrapped(data=None, attributes=None)))
    assert message.data == b""
    assert dict(message.attributes) == {}


def test_each_request_is_a_delivery_of_its_own() -> None:
    first, second = parse({}, body(wrapped())), parse({}, body(wrapped()))
    assert first.message_id == second.message_id
    assert first.ack_id != second.ack_id


def test_a_cloudevent_in_binary_mode() -> None:
    headers = {
        "ce-specversion": "1.0",
        "ce-type": MESSAGE_PUBLISHED,
        "ce-source": "//pubsub.googleapis.com/projects/orders-demo/topics/orders",
        "ce-id": "1001",
        "content-type": "application/json",
    }
    check_message(parse(headers, body(wrapped())), Shape.CLOUDEVENT_BINARY)


def test_a_cloudevent_in_binary_mode_takes_its_id_when_the_message_has_none() -> None:
    headers = {"ce-specversion": "1.0", "ce-type": MESSAGE_PUBLISHED, "ce-id": "1001"}
    check_message(parse(headers, body(wrapped(messageId=None))), Shape.CLOUDEVENT_BINARY)


def test_a_cloudevent_in_structured_mode() -> None:
    event = {
        "specversion": "1.0",
        "type": MESSAGE_PUBLISHED,
        "source": "//pubsub.googleapis.com/projects/orders-demo/topics/orders",
        "id": "1001",
        "datacontenttype": "application/json",
        "data": wrapped(),
    }
    headers = {"content-type": "application/cloudevents+json; charset=utf-8"}
    check_message(parse(headers, body(event)), Shape.CLOUDEVENT_STRUCTURED)


def test_a_cloudevent_in_structured_mode_with_data_base64() -> None:
    event = {
        "specversion": "1.0",
        "type": MESSAGE_PUBLISHED,
        "id": "1001",
        "data_base64": base64.b64encode(body(wrapped())).decode(),
    }
    headers = {"content-type": "application/cloudevents+json"}
    check_message(parse(headers, body(event)), Shape.CLOUDEVENT_STRUCTURED)


def test_a_cloud_run_function_event_data() -> None:
    check_message(from_cloud_event_data(wrapped()), Shape.CLOUDEVENT_BINARY)


def test_the_unwrapped_form_with_metadata_headers() -> None:
    headers = {
        "x-goog-pubsub-message-id": "1001",
        "x-goog-pubsub-publish-time": PUBLISHED,
        "x-goog-pubsub-subscription-name": SUB,
        "x-goog-pubsub-ordering-key": "customer-7",
        "order_id": "o-1",
        "host": "orders-push.run.app",
        "user-agent": "APIs-Google",
        "authorization": "Bearer x",
        "content-length": "19",
        "x-forwarded-for": "10.0.0.1",
        "x-cloud-trace-context": "abc/1",
        "traceparent": "00-abc-01-01",
    }
    message = parse(headers, b'{"order_id": "o-1"}')
    check_message(message, Shape.UNWRAPPED)
    assert message.ordering_key == "customer-7"


def test_the_unwrapped_form_as_the_emulator_sends_it() -> None:
    headers = {
        "op": "k1",
        "mixedcase": "v",
        "x-goog-ordering-key": "ok1",
        "x-goog-pubsub-message-id": "2",
        "x-goog-pubsub-publish-time": "2026-12-01T23:18:56.264Z",
        "x-goog-pubsub-subscription-name": SUB,
        "user-agent": "Java/17.0.15",
        "host": "127.0.0.1:39371",
        "accept": "text/html, image/gif, image/jpeg, */*; q=0.2",
        "connection": "keep-alive",
        "content-type": "application/x-www-form-urlencoded",
        "content-length": "8",
    }
    message = parse(headers, b'{"a": 1}')
    assert dict(message.attributes) == {"op": "k1", "mixedcase": "v"}
    assert (message.message_id, message.ordering_key, message.data) == ("2", "ok1", b'{"a": 1}')


MALFORMED: list[tuple[str, dict[str, str], bytes, str]] = [
    ("empty body", {}, b"", "empty body"),
    ("not JSON", {}, b"hello", "the body is not JSON"),
    ("deep nesting", {}, b"[" * 100_000, "not JSON"),
    ("a JSON array", {}, b"[1, 2]", "a JSON array, not an object"),
    ("no message", {}, body({"subscription": SUB}), '"message" is missing'),
    ("message a string", {}, body({"message": "hi"}), '"message" is a JSON string'),
    ("no message id", {}, body(wrapped(messageId=None)), 'messageId" is missing'),
    ("empty message id", {}, body(wrapped(messageId="")), 'messageId" is missing'),
    ("numeric message id", {}, body(wrapped(messageId=7)), 'messageId" is missing'),
    ("control chars in id", {}, body(wrapped(messageId="a\nb")), "not a message id"),
    ("data not base64", {}, body(wrapped(data="@@@")), '"message.data" is not base64'),
    ("data a number", {}, body(wrapped(data=5)), '"message.data" is a JSON number'),
    ("attributes a list", {}, body(wrapped(attributes=["a"])), "not an object of strings"),
    ("attribute not text", {}, body(wrapped(attributes={"a": 1})), "not an object of strings"),
    ("bad publish time", {}, body(wrapped(publishTime="yesterday")), "not an RFC 3339 time"),
    ("ordering key a number", {}, body(wrapped(orderingKey=3)), 'orderingKey" is not a string'),
    (
        "bad subscription",
        {},
        body({**wrapped(), "subscription": "orders"}),
        "not projects/PROJECT/subscriptions/ID",
    ),
    ("bad attempt", {}, body({**wrapped(), "deliveryAttempt": "x"}), "not a whole number"),
    ("negative attempt", {}, body({**wrapped(), "deliveryAttempt": -1}), "not a whole number"),
    (
        "another CloudEvent type",
        {"ce-specversion": "1.0", "ce-type": "google.cloud.storage.object.v1.finalized"},
        body(wrapped()),
        "not a Pub/Sub message",
    ),
    (
        "structured without data",
        {"content-type": "application/cloudevents+json"},
        body({"specversion": "1.0", "type": MESSAGE_PUBLISHED}),
        "has no data",
    ),
    (
        "structured without specversion",
        {"content-type": "application/cloudevents+json"},
        body({"type": MESSAGE_PUBLISHED, "data": wrapped()}),
        'no "specversion"',
    ),
    (
        "lone surrogate in an attribute",
        {},
        body(wrapped(attributes={"op": "\ud800"})),
        "not valid UTF-8",
    ),
    ("lone surrogate in the id", {}, body(wrapped(messageId="\udcff")), "not valid UTF-8"),
    ("unwrapped empty id", {"x-goog-pubsub-message-id": ""}, b"x", "is missing or empty"),
    (
        "unwrapped bad time",
        {"x-goog-pubsub-message-id": "1", "x-goog-pubsub-publish-time": "soon"},
        b"x",
        "not an RFC 3339 time",
    ),
]


@pytest.mark.parametrize(
    ("headers", "raw", "reason"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_a_malformed_request_is_refused_with_its_reason(
    headers: dict[str, str], raw: bytes, reason: str
) -> None:
    with pytest.raises(Malformed) as caught:
        parse(headers, raw)
    assert reason in caught.value.reason
    assert "\n" not in caught.value.reason


_HEADER_NAMES = st.sampled_from(
    [
        "content-type",
        "ce-specversion",
        "ce-type",
        "ce-id",
        "x-goog-pubsub-message-id",
        "x-goog-pubsub-publish-time",
        "x-goog-pubsub-subscription-name",
        "x-goog-pubsub-delivery-attempt",
        "op",
    ]
)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _near_envelopes() -> st.SearchStrategy[bytes]:
    text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=8)
    message = st.fixed_dictionaries(
        {},
        optional={
            "data": st.one_of(text, st.just("aGk="), _JSONISH),
            "attributes": st.one_of(st.dictionaries(text, text, max_size=3), _JSONISH),
            "messageId": st.one_of(text, _JSONISH),
            "publishTime": st.one_of(st.text(), st.just(PUBLISHED), _JSONISH),
            "orderingKey": _JSONISH,
        },
    )
    envelope = st.fixed_dictionaries(
        {"message": message | _JSONISH},
        optional={"subscription": st.one_of(st.just(SUB), _JSONISH), "deliveryAttempt": _JSONISH},
    )
    return st.one_of(envelope.map(body), _JSONISH.map(body), st.binary(max_size=64))


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(
        _HEADER_NAMES, st.one_of(st.text(max_size=30), st.just(MESSAGE_PUBLISHED))
    ),
    raw=_near_envelopes(),
)
def test_any_request_is_a_message_or_malformed_never_a_crash(
    headers: dict[str, str], raw: bytes
) -> None:
    try:
        message = parse(headers, raw)
    except Malformed as exc:
        reason = exc.reason
        assert reason
        return
    assert isinstance(message, PushMessage)
    assert message.message_id
    assert isinstance(message.data, bytes)
