"""Every push request shape read into the stock client's message fields, and malformed ones."""

from __future__ import annotations

import base64
import datetime
import json
import math
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
    ("bad attempt", {}, body({**wrapped(), "deliveryAttempt": "x"}), "not a delivery count"),
    ("negative attempt", {}, body({**wrapped(), "deliveryAttempt": -1}), "not a delivery count"),
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


# -- numbers: deliveryAttempt in every shape -------------------------------------------

_ATTEMPT_TEXT = {  # the JSON text of a deliveryAttempt, as a sender might write it
    "huge float": "1e400",
    "huge negative float": "-1e400",
    "finite huge float": "1e300",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "NaN": "NaN",
    "float": "3.0",
    "fraction": "2.5",
    "negative": "-1",
    "true": "true",
    "false": "false",
    "over int32": "2147483648",
    "huge int": "1" + "0" * 400,
    "text": '"x"',
    "text float": '"3.0"',
    "text exponent": '"1e3"',
    "text negative": '"-2"',
    "text Arabic-Indic digit": '"\\u0663"',
    "text with underscore": '"1_0"',
    "text over int32": '"99999999999999999999"',
    "an array": "[3]",
    "an object": '{"n": 3}',
}


def _with_attempt(text: str, name: str = "deliveryAttempt") -> bytes:
    """A valid wrapped envelope with ``"name": <text>`` written as raw JSON text."""
    return body(wrapped())[:-1] + f', "{name}": {text}}}'.encode()


def _shapes(raw_envelope: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The envelope in each shape that carries one: wrapped, CloudEvent binary, structured."""
    event = b'{"specversion": "1.0", "type": "%s", "id": "1001", "data": %s}' % (
        MESSAGE_PUBLISHED.encode(),
        raw_envelope,
    )
    return [
        ({"content-type": "application/json"}, raw_envelope),
        ({"ce-specversion": "1.0", "ce-type": MESSAGE_PUBLISHED, "ce-id": "1001"}, raw_envelope),
        ({"content-type": "application/cloudevents+json"}, event),
    ]


@pytest.mark.parametrize("spelling", ["deliveryAttempt", "delivery_attempt"])
@pytest.mark.parametrize("text", list(_ATTEMPT_TEXT.values()), ids=list(_ATTEMPT_TEXT))
def test_a_delivery_attempt_that_is_no_count_is_malformed_in_every_shape(
    text: str, spelling: str
) -> None:
    for headers, raw in _shapes(_with_attempt(text, spelling)):
        with pytest.raises(Malformed) as caught:
            parse(headers, raw)
        assert "not a delivery count" in caught.value.reason, (headers, caught.value.reason)
        assert f'"{spelling}"' in caught.value.reason


@pytest.mark.parametrize(
    "value",
    [
        "1e400",
        "inf",
        "-inf",
        "nan",
        "Infinity",
        "-1",
        "3.0",
        "true",
        "x",
        "2147483648",
        "99999999999999999999",
        "\u0663",
        "1_0",
        "+3",
        "0x10",
        "9" * 5000,
    ],
)
def test_a_delivery_attempt_header_that_is_no_count_is_malformed(value: str) -> None:
    headers = {"x-goog-pubsub-message-id": "1001", "x-goog-pubsub-delivery-attempt": value}
    with pytest.raises(Malformed) as caught:
        parse(headers, b"data")
    assert "x-goog-pubsub-delivery-attempt is not a delivery count" in caught.value.reason


def test_a_delivery_attempt_is_a_count_up_to_int32_and_no_further() -> None:
    accepted = {"3": 3, '"3"': 3, "0": None, "null": None, '""': None, "2147483647": 2**31 - 1}
    for text, expected in accepted.items():
        for headers, raw in _shapes(_with_attempt(text)):
            assert parse(headers, raw).delivery_attempt == expected, (text, headers)
    for headers, raw in _shapes(_with_attempt("2147483648")):
        with pytest.raises(Malformed):
            parse(headers, raw)
    unwrapped = {"x-goog-pubsub-message-id": "1001", "x-goog-pubsub-delivery-attempt": "7"}
    assert parse(unwrapped, b"data").delivery_attempt == 7
    unwrapped["x-goog-pubsub-delivery-attempt"] = "2147483648"
    with pytest.raises(Malformed):
        parse(unwrapped, b"data")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attributes", False),
        ("attributes", []),
        ("attributes", ""),
        ("orderingKey", False),
        ("orderingKey", 0),
        ("orderingKey", []),
    ],
)
def test_a_field_of_the_wrong_kind_is_malformed_even_when_empty(field: str, value: Any) -> None:
    with pytest.raises(Malformed):
        parse({}, body(wrapped(**{field: value})))


def test_a_publish_time_past_the_last_representable_instant_is_malformed() -> None:
    # A valid RFC 3339 time that rounds up into the year 10000 as a datetime.
    with pytest.raises(Malformed) as caught:
        parse({}, body(wrapped(publishTime="9999-12-31T23:59:59.999999999Z")))
    assert "not an RFC 3339 time" in caught.value.reason


# -- the key attribute in the unwrapped form -----------------------------------------------


def _unwrapped_headers(**attributes: str) -> dict[str, str]:
    # As the HTTP stack hands them over: every name lower-cased.
    return {"x-goog-pubsub-message-id": "1001", **{k.lower(): v for k, v in attributes.items()}}


def test_the_key_attribute_arrives_under_its_own_spelling_in_the_unwrapped_form() -> None:
    headers = _unwrapped_headers(orderId="o-1", tenantName="acme")
    message = parse(headers, b"data", key_attribute="orderId")
    assert dict(message.attributes) == {"orderId": "o-1", "tenantname": "acme"}
    without = parse(headers, b"data")  # no key attribute configured: every name lower-cased
    assert dict(without.attributes) == {"orderid": "o-1", "tenantname": "acme"}


def test_a_lowercase_key_attribute_and_the_wrapped_form_are_unchanged() -> None:
    headers = _unwrapped_headers(order_id="o-1")
    assert dict(parse(headers, b"d", key_attribute="order_id").attributes) == {"order_id": "o-1"}
    # Wrapped, names keep their spelling: no case folding, the key attribute is matched exactly.
    message = parse({}, body(wrapped(attributes={"orderid": "o-1"})), key_attribute="orderId")
    assert dict(message.attributes) == {"orderid": "o-1"}


# -- anything else: a message or Malformed, never another exception ---------------------------

# ASGI servers decode header values as latin-1: any of its 256 characters may arrive.
_HEADER_TEXT = st.text(st.characters(max_codepoint=255), max_size=30)
_HEADER_NAMES = st.text(
    st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12
).map(str.lower)
_EDGES = st.sampled_from(
    [math.inf, -math.inf, math.nan, 1e300, 3.0, -1, 2**31, 10**400, 0, 2**31 - 1]
)
_NUMBERS = st.one_of(st.integers(), st.floats(), _EDGES)  # inf and nan included
_JSONISH = st.recursive(
    st.none() | st.booleans() | _NUMBERS | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_TEXT = st.text(st.characters(blacklist_categories=()), max_size=8)  # surrogates included
_TIMES = st.sampled_from(
    [PUBLISHED, "9999-12-31T23:59:59.9999999Z", "0001-01-01T00:00:00Z", "2026-02-30T00:00:00Z"]
)
_ATTEMPTS = st.one_of(_NUMBERS, st.text(st.sampled_from("0123456789e.-+_ "), max_size=6))


_ANY = st.one_of(_JSONISH, _NUMBERS, _TEXT, _TIMES, _ATTEMPTS)
_VALID_MESSAGE = {
    "data": "aGk=",
    "attributes": {"op": "k"},
    "messageId": "1001",
    "message_id": "1001",
    "publishTime": PUBLISHED,
    "orderingKey": "customer-7",
}
_VALID_HEADERS = {
    "x-goog-pubsub-message-id": "1001",
    "x-goog-pubsub-publish-time": PUBLISHED,
    "x-goog-pubsub-subscription-name": SUB,
    "x-goog-pubsub-ordering-key": "customer-7",
    "x-goog-pubsub-delivery-attempt": "3",
}


def _corrupted(draw: st.DrawFn, valid: dict[str, Any], nasty: st.SearchStrategy[Any]) -> Any:
    """``valid`` with up to two fields removed or replaced by ``nasty`` values."""
    fields = dict(valid)
    for name in draw(st.sets(st.sampled_from(sorted(fields)), max_size=2)):
        if draw(st.booleans()):
            fields[name] = draw(nasty)
        else:
            del fields[name]
    return fields


@st.composite
def _requests(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """A valid request of one shape with a field or two broken, or anything at all."""
    message = _corrupted(draw, _VALID_MESSAGE, _ANY)
    envelope = {"message": message, **_corrupted(draw, {"subscription": SUB}, _ANY)}
    spelling = draw(st.sampled_from(["deliveryAttempt", "delivery_attempt", None]))
    if spelling is not None:
        envelope[spelling] = draw(st.one_of(_EDGES, _ATTEMPTS, _ANY))
    if draw(st.sampled_from([False] * 9 + [True])):
        envelope["message"] = draw(_ANY)
    extra = draw(st.dictionaries(_HEADER_NAMES, _HEADER_TEXT, max_size=3))
    shape = draw(st.sampled_from(["wrapped", "binary", "structured", "unwrapped", "anything"]))
    if shape == "wrapped":
        return {**extra, "content-type": "application/json"}, body(envelope)
    if shape == "binary":
        ce = {"ce-specversion": "1.0", "ce-type": MESSAGE_PUBLISHED, "ce-id": "1001"}
        return {**extra, **_corrupted(draw, ce, _HEADER_TEXT)}, body(envelope)
    if shape == "structured":
        event = _corrupted(draw, {"specversion": "1.0", "type": MESSAGE_PUBLISHED}, _ANY)
        form = draw(st.sampled_from(["data", "text", "base64", "anything"]))
        if form == "data":
            event["data"] = envelope
        elif form == "text":
            event["data"] = json.dumps(envelope)
        elif form == "base64":
            event["data_base64"] = base64.b64encode(body(envelope)).decode()
        else:
            event[draw(st.sampled_from(["data", "data_base64"]))] = draw(_ANY)
        return {**extra, "content-type": "application/cloudevents+json"}, body(event)
    if shape == "unwrapped":
        nasty = _HEADER_TEXT | _ATTEMPTS.map(str) | _TIMES
        headers = {**extra, **_corrupted(draw, _VALID_HEADERS, nasty)}
        headers.setdefault("x-goog-pubsub-message-id", draw(_HEADER_TEXT))
        return headers, draw(st.binary(max_size=32))
    return extra, draw(st.one_of(_JSONISH.map(body), st.binary(max_size=64)))


@settings(max_examples=300, deadline=None)
@given(
    request=_requests(),
    key_attribute=st.one_of(st.none(), st.just("orderId"), st.text(min_size=1, max_size=8)),
)
def test_any_request_is_a_message_or_malformed_never_a_crash(
    request: tuple[dict[str, str], bytes], key_attribute: str | None
) -> None:
    headers, raw = request
    try:
        message = parse(headers, raw, key_attribute=key_attribute)
    except Malformed as exc:
        reason = exc.reason
        assert reason
        assert "\n" not in reason
        return
    assert isinstance(message, PushMessage)
    assert message.message_id
    assert isinstance(message.data, bytes)
    assert message.publish_time.tzinfo is not None
    assert message.delivery_attempt is None or 1 <= message.delivery_attempt < 2**31
