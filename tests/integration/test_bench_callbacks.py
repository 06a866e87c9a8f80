"""``python -m benchmarks.callbacks``: both callbacks consume a real stream of the emulator."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import callbacks
from benchmarks.lean import LeanDelivery
from emulator.pytest_plugin import MakeSubscription


def _published(make_subscription: MakeSubscription, publisher: Any, messages: int) -> str:
    handle = make_subscription(exactly_once=True, ack_deadline_seconds=60)
    sent = [publisher.publish(handle.topic_path, b"x" * 64, job=f"k{n}") for n in range(messages)]
    for future in sent:
        future.result(timeout=30)
    return str(handle.subscription_path)


def test_each_side_consumes_every_message_and_its_callback_threads_cpu_is_taken(
    make_subscription: MakeSubscription, publisher: Any, subscriber: Any
) -> None:
    stock = callbacks.consume(
        "stock",
        subscription=_published(make_subscription, publisher, 30),
        messages=30,
        in_flight=4,
        subscriber=subscriber,
    )
    wrapped = callbacks.consume(
        "wrapped",
        subscription=_published(make_subscription, publisher, 30),
        messages=30,
        in_flight=4,
        subscriber=subscriber,
        profile=True,
    )
    assert stock.calls is None  # not profiled
    assert stock.callbacks_ms > 0
    assert stock.process_ms >= stock.callbacks_ms > 0
    assert wrapped.process_ms >= wrapped.callbacks_ms > 0
    # the wrapper's delivery is hundreds of calls; a profile that saw no callback would count 0
    assert wrapped.calls is not None
    assert wrapped.calls > 100


def test_the_lean_prototype_completes_every_message_on_fewer_threads_than_in_flight(
    make_subscription: MakeSubscription, publisher: Any, subscriber: Any
) -> None:
    lean = callbacks.consume(
        "lean",
        subscription=_published(make_subscription, publisher, 20),
        messages=20,
        in_flight=8,
        threads=2,
        subscriber=subscriber,
    )
    assert lean.side == "lean"
    assert lean.process_ms >= lean.callbacks_ms > 0
    assert 1 <= lean.threads <= 2  # eight in flight, on the two threads it was given


def test_a_lean_delivery_that_fails_is_an_error_not_a_figure(
    make_subscription: MakeSubscription, publisher: Any, subscriber: Any, monkeypatch: Any
) -> None:
    def refused(self: Any, message: Any) -> None:
        raise RuntimeError("not claimed")

    monkeypatch.setattr(callbacks, "_TIMEOUT_S", 5.0)
    monkeypatch.setattr(LeanDelivery, "__call__", refused)
    # the client ends the stream with a callback's error, and its future raises it
    with pytest.raises(RuntimeError, match="not claimed"):
        callbacks.consume(
            "lean",
            subscription=_published(make_subscription, publisher, 3),
            messages=3,
            in_flight=2,
            subscriber=subscriber,
        )


def test_a_message_never_consumed_is_an_error_not_a_hang(
    make_subscription: MakeSubscription, publisher: Any, subscriber: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(callbacks, "_TIMEOUT_S", 3.0)
    subscription = _published(make_subscription, publisher, 2)
    with pytest.raises(RuntimeError, match="not consumed"):
        callbacks.consume(
            "stock", subscription=subscription, messages=3, in_flight=2, subscriber=subscriber
        )


def test_counts_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        callbacks.main(["--rounds", "0"])
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("store", ["memory", "firestore"])
def test_the_floor_completes_every_message_on_either_store(
    make_subscription: MakeSubscription,
    publisher: Any,
    subscriber: Any,
    firestore_client: Any,
    monkeypatch: Any,
    store: str,
) -> None:
    stores: list[Any] = []
    made = callbacks._side

    def side(*args: Any) -> Any:
        inner, wrapped, used = made(*args)
        stores.append(used)
        return inner, wrapped, used

    monkeypatch.setattr(callbacks, "_side", side)
    floor = callbacks.consume(
        "floor",
        subscription=_published(make_subscription, publisher, 12),
        messages=12,
        in_flight=4,
        subscriber=subscriber,
        firestore=firestore_client if store == "firestore" else None,
    )
    assert floor.side == "floor"
    assert floor.process_ms >= floor.callbacks_ms > 0
    (used,) = stores
    assert type(used).__name__ == (
        "MemoryJobStore" if store == "memory" else "BatchingFirestoreJobStore"
    )
    # every job's document written completed, by the floor alone
    if store == "memory":
        statuses = [snap.fields["status"] for snap in used.snapshots().values()]
    else:
        documents = firestore_client.collection(used.collection).stream()
        statuses = [document.to_dict()["status"] for document in documents]
    assert statuses == ["completed"] * 12
