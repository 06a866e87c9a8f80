"""``quick_init``: a frozen dataclass built through its ``__dict__``, nothing else changed."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field
from typing import Any, ClassVar

import pytest

from pubsub_worker._support.values import quick_init


def _shape() -> Any:
    """A fresh frozen dataclass with every kind of field ``quick_init`` handles."""

    @dataclass(frozen=True)
    class Shape:
        name: str
        size: int = 3
        tags: list[str] = field(default_factory=list)
        hidden: int = field(default=7, init=False)
        made: list[int] = field(default_factory=lambda: [1], init=False)
        label: str = field(default="x", kw_only=True)
        count: ClassVar[int] = 0

    return Shape


def test_it_builds_what_the_dataclass_builds() -> None:
    plain, quick = _shape(), quick_init(_shape())
    for args, kwargs in [(("a",), {}), (("b", 5, ["t"]), {"label": "y"}), ((), {"name": "c"})]:
        built, expected = quick(*args, **kwargs), plain(*args, **kwargs)
        assert dataclasses.asdict(built) == dataclasses.asdict(expected)
        assert repr(built).split("(", 1)[1] == repr(expected).split("(", 1)[1]
        assert built.hidden == expected.hidden == 7
    assert quick("a") == quick("a")
    assert quick("a") != quick("b")


def test_its_parameters_are_the_dataclass_s() -> None:
    plain, quick = _shape(), quick_init(_shape())
    old = inspect.signature(plain.__init__).parameters
    new = inspect.signature(quick.__init__).parameters
    assert [(p.name, p.kind) for p in new.values()] == [(p.name, p.kind) for p in old.values()]
    with pytest.raises(TypeError):
        quick("a", 1, [], "positional label")
    with pytest.raises(TypeError):
        quick()


def test_a_default_factory_runs_per_instance() -> None:
    quick = quick_init(_shape())
    first, second = quick("a"), quick("b")
    assert first.tags == second.tags == []
    assert first.tags is not second.tags
    assert first.made is not second.made
    given = ["mine"]
    assert quick("c", 1, given).tags is given


def test_writes_are_still_refused() -> None:
    built = quick_init(_shape())("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.name = "b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.size


def test_replace_and_pickle_go_through_it() -> None:
    quick = quick_init(_shape())
    globals()["PickledShape"] = quick  # pickle finds a class by its module and name
    quick.__qualname__ = "PickledShape"
    try:
        built = quick("a", 2, ["t"], label="z")
        assert dataclasses.replace(built, size=9) == quick("a", 9, ["t"], label="z")
        assert pickle.loads(pickle.dumps(built)) == built
    finally:
        del globals()["PickledShape"]


def test_post_init_runs_after_the_fields_are_set() -> None:
    @quick_init
    @dataclass(frozen=True)
    class Checked:
        low: int
        high: int

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError("low above high")

    assert Checked(1, 2).high == 2
    with pytest.raises(ValueError, match="low above high"):
        Checked(3, 2)


def test_what_it_cannot_build_is_refused() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclass(frozen=True)
    class WithInitVar:
        a: int
        seed: InitVar[int] = 0

    with pytest.raises(TypeError, match="not a frozen dataclass"):
        quick_init(Mutable)
    with pytest.raises(TypeError, match="not a frozen dataclass"):
        quick_init(int)
    with pytest.raises(TypeError, match="__slots__"):
        quick_init(Slotted)
    with pytest.raises(TypeError, match="cannot all be set"):
        quick_init(WithInitVar)
