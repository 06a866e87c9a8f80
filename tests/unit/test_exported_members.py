"""Every public name of a public module is exported on purpose, and every export is real.

For each public module: a public (non-underscore) name that the module defines (a function,
a class, a constant) is in its ``__all__``; every ``__all__`` entry exists, and is either
defined in the module or re-exported from one of its own submodules, under the name its
defining module gives it. The package root and ``stores`` exist to re-export: every public
name they import from inside the package is in their ``__all__``.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

PUBLIC_MODULES = [
    "pubsub_worker",
    "pubsub_worker.errors",
    "pubsub_worker.settings",
    "pubsub_worker.hooks",
    "pubsub_worker.stores",
    "pubsub_worker.cli",
]

# Modules whose purpose is to gather names from their submodules.
REEXPORTING = {"pubsub_worker", "pubsub_worker.stores"}


def _targets(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for element in node.elts for name in _targets(element)]
    return []


def _bound_at_top_level(body: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """Names the statements define, and names they import from inside the package."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(name for target in node.targets for name in _targets(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            defined.update(_targets(node.target))
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0 or (node.module or "").startswith("pubsub_worker"):
                imported.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [node.finalbody, *(handler.body for handler in node.handlers)]
            for block in blocks:
                more_defined, more_imported = _bound_at_top_level(block)
                defined |= more_defined
                imported |= more_imported
    return defined, imported


def _source_names(module: ModuleType) -> tuple[set[str], set[str]]:
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    defined, imported = _bound_at_top_level(tree.body)
    public = {name for name in defined | imported if not name.startswith("_")}
    return defined & public, imported & public


def _is_submodule(module: ModuleType, name: str) -> bool:
    value = getattr(module, name, None)
    return isinstance(value, ModuleType) and value.__name__ == f"{module.__name__}.{name}"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_name_defined_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    defined, imported = _source_names(module)
    expected = defined | imported if name in REEXPORTING else defined
    missing = sorted(
        member
        for member in expected
        if member not in module.__all__ and not _is_submodule(module, member)
    )
    assert missing == [], f"{name} defines or gathers these but does not export them"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_export_exists_where_it_is_defined(name: str) -> None:
    module = importlib.import_module(name)
    defined, _ = _source_names(module)
    assert len(module.__all__) == len(set(module.__all__)), "an export listed twice"
    for member in module.__all__:
        assert hasattr(module, member), f"{name}.{member} is exported but does not exist"
        value = getattr(module, member)
        defines_its_module = inspect.isclass(value) or inspect.isroutine(value)
        home: str | None = value.__module__ if defines_its_module else None
        if home is None:
            # A constant: it has no __module__, so it must be assigned here.
            assert member in defined, f"{name}.{member} is neither defined nor re-exported here"
            continue
        assert home == name or home.startswith(f"{name}."), (
            f"{name}.{member} comes from {home}, outside {name}"
        )
        # A re-export is the defining module's own object under the same name, not an alias.
        assert getattr(sys.modules[home], member) is value, f"{name}.{member} is an alias"


def test_the_root_exports_nothing_by_accident() -> None:
    import pubsub_worker

    # Importing the package binds its public submodules too (errors, hooks, settings,
    # stores, and those the re-exports come from); nothing else is public there.
    unexpected = sorted(
        member
        for member, value in vars(pubsub_worker).items()
        if not member.startswith("_")
        and member not in pubsub_worker.__all__
        and not _is_submodule(pubsub_worker, member)
        and value is not __future__.annotations
    )
    assert unexpected == []
