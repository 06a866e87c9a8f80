"""The benchmark's RPC counter: every call on a counted channel counted, nothing else changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
from google.cloud.firestore_v1.types import write as write_types

from benchmarks.counting import CountedChannel, RpcCounter
from pubsub_worker.stores._batch_rpc import request


class _Method:
    """A fake multi-callable: answers what it was called with."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return ("call", self.name, request, kwargs)

    def with_call(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return ("with_call", self.name, request, kwargs)

    def future(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return ("future", self.name, request, kwargs)


class _Channel:
    """A fake channel: hands out :class:`_Method` and records what else it was asked."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, Any, Any, Any]] = []
        self.closed = 0
        self.subscribed: list[tuple[Any, bool]] = []

    def _make(self, kind: str, method: str, ser: Any, de: Any, registered: Any) -> _Method:
        self.made.append((kind, method, ser, de, registered))
        return _Method(method)

    def unary_unary(self, method: str, ser: Any = None, de: Any = None, reg: Any = False) -> Any:
        return self._make("unary_unary", method, ser, de, reg)

    def unary_stream(self, method: str, ser: Any = None, de: Any = None, reg: Any = False) -> Any:
        return self._make("unary_stream", method, ser, de, reg)

    def stream_unary(self, method: str, ser: Any = None, de: Any = None, reg: Any = False) -> Any:
        return self._make("stream_unary", method, ser, de, reg)

    def stream_stream(self, method: str, ser: Any = None, de: Any = None, reg: Any = False) -> Any:
        return self._make("stream_stream", method, ser, de, reg)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self.subscribed.append((callback, try_to_connect))

    def unsubscribe(self, callback: Any) -> None:
        self.subscribed.remove((callback, True))

    def close(self) -> None:
        self.closed += 1


def _counted() -> tuple[RpcCounter, _Channel, CountedChannel]:
    counter, inner = RpcCounter(), _Channel()
    channel = counter.intercept(inner)  # type: ignore[arg-type]
    assert isinstance(channel, CountedChannel)
    assert isinstance(channel, grpc.Channel)
    return counter, inner, channel


def _deserialize(data: bytes) -> bytes:
    return data


def test_each_call_is_counted_by_method_and_passed_through_as_made() -> None:
    counter, inner, channel = _counted()
    write = "/google.firestore.v1.Firestore/BatchWrite"
    batch: Any = channel.unary_unary(write, None, _deserialize, True)
    assert inner.made == [("unary_unary", write, None, _deserialize, True)]
    raw = request("d", [])  # sent serialized, as the batching store sends it
    assert batch(raw, timeout=5) == ("call", write, raw, {"timeout": 5})
    assert batch.with_call(raw) == ("with_call", write, raw, {})
    assert batch.future(raw, metadata=()) == ("future", write, raw, {"metadata": ()})
    pull: Any = channel.stream_stream("/google.pubsub.v1.Subscriber/StreamingPull")
    assert pull(iter(()))[0] == "call"
    channel.unary_stream("/x.Y/Listen")(b"q")
    channel.stream_unary("/x.Y/Upload")(iter(()))
    calls = counter.snapshot()["calls"]
    assert calls == {"BatchWrite": 3, "StreamingPull": 1, "Listen": 1, "Upload": 1}
    # Two of the three BatchWrites were waited for here; a future's time is not.
    assert set(counter.snapshot()["micros"]) == {"BatchWrite"}


def test_what_firestore_bills_and_what_a_request_carries_is_counted() -> None:
    counter, _, channel = _counted()
    delete = SimpleNamespace(WhichOneof=lambda _: "delete")
    update = SimpleNamespace(WhichOneof=lambda _: "update")
    channel.unary_unary("/google.firestore.v1.Firestore/Commit")(
        SimpleNamespace(writes=[update, delete])
    )
    channel.unary_unary("/google.firestore.v1.Firestore/BatchGetDocuments")(
        SimpleNamespace(documents=["a", "b", "c"])
    )
    channel.unary_unary("/google.pubsub.v1.Subscriber/Acknowledge")(
        SimpleNamespace(ack_ids=["1", "2"])
    )
    got = counter.snapshot()
    assert got["items"] == {"Commit": 2, "Acknowledge": 2}
    assert got["deletes"] == {"Commit": 1}
    assert got["reads"] == {"BatchGetDocuments": 3}


def test_a_write_request_sent_serialized_is_counted_from_its_bytes() -> None:
    """As the batching store sends its ``BatchWrite``: the request's bytes, built by the
    library's own :func:`~pubsub_worker.stores._batch_rpc.request`."""
    database = "projects/p/databases/(default)"
    update, delete = write_types.Write.pb()(), write_types.Write.pb()()
    update.update.name = f"{database}/documents/jobs/a"
    update.update.fields["epoch"].integer_value = 1
    update.current_document.exists = False
    delete.delete = f"{database}/documents/jobs/b"
    writes = [update.SerializeToString(), delete.SerializeToString(), update.SerializeToString()]
    counter, _, channel = _counted()
    channel.unary_unary("/google.firestore.v1.Firestore/BatchWrite")(request(database, writes))
    channel.unary_unary("/google.firestore.v1.Firestore/BatchWrite")(request(database, writes[:1]))
    got = counter.snapshot()
    assert got["calls"] == {"BatchWrite": 2}
    assert got["items"] == {"BatchWrite": 4}
    assert got["deletes"] == {"BatchWrite": 1}


def test_everything_but_the_calls_is_the_channels_own() -> None:
    _, inner, channel = _counted()

    def callback(state: Any) -> None:
        return None

    channel.subscribe(callback, try_to_connect=True)
    assert inner.subscribed == [(callback, True)]
    channel.unsubscribe(callback)
    assert inner.subscribed == []
    with channel as same:
        assert same is channel
    channel.close()
    assert inner.closed == 2
