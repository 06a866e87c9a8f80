"""The package's layers: no module imports one above it, and no import cycle.

Layers, bottom up (a module may import its own layer's modules and those below)::

    errors, hooks, _attributes              what everything may use
    settings, _variables                    parsed once, at the edge; the variables' names
    _support                                logs, metrics, tracing, limits, clients, text
    stores, _delivery                       the store contract and stores; the Pub/Sub side
    _job                                    the Firestore side: the job a handler sees
    _worker, _ops, push, ui                 the engine; what the operator's commands run; the
                                            push endpoint (a push request through the engine);
                                            the jobs dashboard (through _ops)
    cli, __init__                           the command and the front door

Run alone: ``pytest tests/unit/test_layers.py``; it reads the imports, nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pubsub_worker"

LAYERS: dict[str, int] = {
    "errors": 0,
    "hooks": 0,
    "_attributes": 0,
    "settings": 1,
    "_variables": 1,
    "_support": 2,
    "stores": 3,
    "_delivery": 3,
    "_job": 4,
    "_worker": 5,
    "_ops": 5,
    "push": 5,
    "ui": 5,
    "cli": 6,
    "__init__": 7,
}


def _unit(module: str) -> str:
    """The layer unit of ``pubsub_worker.x.y``: its first part below the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The pubsub_worker modules ``path`` imports (any form, relative ones resolved)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "pubsub_worker":
                continue
            found.add(target)
            for alias in node.names:  # `from pkg import module`
                candidate = f"{target}.{alias.name}"
                if _path_of(candidate) is not None:
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "pubsub_worker")
    found.discard(module)
    return {m for m in found if _path_of(m) is not None}


def _path_of(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _graph() -> dict[str, set[str]]:
    return {_module_of(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_part_of_the_package_has_a_layer() -> None:
    units = {_unit(module) for module in _graph()}
    assert units <= set(LAYERS), f"give these a layer: {sorted(units - set(LAYERS))}"


def test_no_module_imports_one_above_it() -> None:
    upward = [
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        for imported in imports
        if LAYERS.get(_unit(imported), 99) > LAYERS.get(_unit(module), -1)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    graph = _graph()
    # A package's __init__ is its front door (``from pubsub_worker import errors`` names the
    # package first): only edges between modules count.
    modules = {m for m in graph if _path_of(m) is not None and _path_of(m).name != "__init__.py"}  # type: ignore[union-attr]
    edges = {m: sorted(graph[m] & modules) for m in modules}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        for nxt in edges[node]:
            if nxt in stack:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*stack, nxt])
        done.add(node)

    for node in sorted(modules):
        if node not in done:
            visit(node, [node])
    assert cycles == []


def test_both_doors_enter_the_engine_and_nothing_else_of_it() -> None:
    """The pull adapter and the push endpoint are thin: each reaches the delivery engine
    (intake, handler call, lifecycle) through ``_worker.engine`` alone, so no copy of
    either can grow beside it."""
    graph = _graph()
    doors = ["pubsub_worker._worker.wrapper"] + [m for m in graph if _unit(m) == "push"]
    entered = {
        door: sorted(m for m in graph[door] if _unit(m) == "_worker" and m != door)
        for door in doors
    }
    assert entered["pubsub_worker._worker.wrapper"] == ["pubsub_worker._worker.engine"]
    assert entered["pubsub_worker.push.delivery"] == ["pubsub_worker._worker.engine"]
    assert all(found in ([], ["pubsub_worker._worker.engine"]) for found in entered.values()), (
        entered
    )


def test_the_engine_and_the_operators_commands_do_not_import_each_other() -> None:
    """``_worker`` and ``_ops`` share a layer, yet neither reaches into the other: what both
    read (the listing index, the stored vocabulary) lives in ``stores``."""
    graph = _graph()
    crossing = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for imported in imports
        if {_unit(module), _unit(imported)} == {"_worker", "_ops"}
    ]
    assert crossing == []


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_module_over_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 400, "past ~400 lines a module does two things"
