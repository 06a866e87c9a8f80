"""Frozen dataclasses that cost no more to build than mutable ones: :func:`quick_init`.

A delivery builds a dozen small immutable values (what happened, the decision,
the job's identity, the claim request and its answer, the record...).
``@dataclass(frozen=True)`` builds each through ``object.__setattr__``, a call
per field (the class's own ``__setattr__`` refuses every write): two to three
times what a mutable dataclass costs, about 7 us of a delivery's 100 in the
library's own Python (``python -m benchmarks.inprocess``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")

_FACTORY = object()
"""A parameter's default where its field has a ``default_factory``: called per instance."""


def quick_init(cls: type[T]) -> type[T]:
    """Give a frozen dataclass an ``__init__`` that writes its fields into ``__dict__``.

    Apply it above ``@dataclass(frozen=True)``. Everything else the dataclass
    made stays: equality, hash, repr, ``dataclasses.replace`` and ``fields``,
    and writes refused with ``FrozenInstanceError``. The new ``__init__`` takes
    the same parameters in the same order, with the same defaults (a
    ``default_factory`` called per instance), and calls ``__post_init__`` if
    the class has one. Refused with ``TypeError``: a class that is not a frozen
    dataclass, one with ``__slots__`` (no ``__dict__`` to write), and one whose
    ``__init__`` would not take the same parameters (an ``InitVar``).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__qualname__} is not a frozen dataclass")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__qualname__} has __slots__: its fields are not in a __dict__")
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keywords: list[str] = []
    body = ["    fields = self.__dict__"]
    shape: Any = cls  # a dataclass, checked above
    for field in dataclasses.fields(shape):
        name = field.name
        default, factory = f"_default_{name}", f"_factory_{name}"
        if not field.init and field.default_factory is dataclasses.MISSING:
            continue  # read from the class, as the dataclass's own __init__ leaves it
        if field.default is not dataclasses.MISSING:
            names[default] = field.default
            value, parameter = default, f"{name}={default}"
        elif field.default_factory is not dataclasses.MISSING:
            names[factory] = field.default_factory
            value, parameter = f"{factory}()", f"{name}=_FACTORY"
            if field.init:
                body.append(f"    if {name} is _FACTORY:\n        {name} = {factory}()")
        else:
            value, parameter = "", name
        if field.init:
            (keywords if field.kw_only else positional).append(parameter)
            value = name
        body.append(f"    fields[{name!r}] = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    source = f"def __init__({signature}) -> None:\n" + "\n".join(body) + "\n"
    made: dict[str, Any] = {}
    exec(source, names, made)  # noqa: S102 - built from the dataclass's own field names
    init = made["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    if _parameters(init) != _parameters(cls.__init__):
        raise TypeError(f"{cls.__qualname__}'s fields cannot all be set from its __dict__")
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def _parameters(init: Any) -> list[tuple[str, Any, bool]]:
    """Each parameter's name and kind, and whether it has a default."""
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(init).parameters.values()
    ]
