"""The import graph: no import circle, and no upward import between the layers.

Every ``.py`` file of the top-level packages is parsed with ``ast`` (nothing is imported), and
every import of one of our modules counts: at module level, under ``if TYPE_CHECKING:``, and
inside functions. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else
to ``pkg`` (its ``__init__``). A circle is a strongly connected set of two or more modules; with
the layers below holding, each lies inside one top-level folder (issue 41: "no circles"). The
layers are shared/DESIGN.md's "Layout".
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("catalog", "gateway", "mint", "schemas", "streams", "workers", "benchmarks")

# Circles that exist today, each a strongly connected set of modules. A circle found must lie
# within one of these (a circle that shrinks as it is being removed still passes). None left:
# a new one is moved apart (the shared piece down a module) rather than listed here.
ALLOWED_CYCLES: tuple[frozenset[str], ...] = ()

# What each layer may not import (shared/DESIGN.md, "Layout"): schemas at the bottom, then
# streams and catalog, then workers; gateway and mint on top (nothing imports mint but the
# benchmarks); the benchmarks are imported by nothing.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "schemas": ("streams", "catalog", "workers", "gateway", "mint", "benchmarks"),
    "streams": ("catalog", "workers", "gateway", "mint", "benchmarks"),
    "catalog": ("streams", "workers", "gateway", "mint", "benchmarks"),
    "workers": ("gateway", "mint", "benchmarks"),
    "gateway": ("mint", "benchmarks"),
    "mint": ("benchmarks",),
}

# Upward imports that exist today, as (importer, imported module): none.
ALLOWED_UPWARD: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules (None: not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imported_names(module: str, path: Path) -> Iterable[str]:
    """Every dotted name the file imports, anywhere in it (relative imports made absolute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                yield f"{target}.{alias.name}"  # resolves to pkg.name, or else to pkg


@cache
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = {_resolve(imported, modules) for imported in _imported_names(name, path)}
        graph[name] = frozenset(t for t in targets if t is not None and t != name)
    return graph


def _strongly_connected(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iteratively; only the sets of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_graph_sees_every_package_and_every_kind_of_import() -> None:
    graph = _graph()
    assert {name.split(".")[0] for name in graph} == set(PACKAGES)
    assert "catalog.base" in graph["catalog.repository"]  # module level
    assert "catalog.repository" in graph["catalog.rebuild"]
    assert "workers.trainer.rank_group" in graph["workers.trainer.engine"]  # TYPE_CHECKING
    assert "workers.trainer.ranks" in graph["workers.trainer.worker"]  # inside a function


def test_the_cycle_finder_finds_a_circle_and_only_circles() -> None:
    graph = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a", "d"}),
        "d": frozenset(),
    }
    assert _strongly_connected(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_circle() -> None:
    cycles = _strongly_connected(_graph())
    unexpected = [c for c in cycles if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not unexpected, "import circles (move the shared piece down): " + "; ".join(
        " <-> ".join(sorted(c)) for c in unexpected
    )


def test_the_allowed_circles_are_still_there() -> None:
    """Skipped (not failed, so whoever removes one is not stopped) when an allowed circle is
    gone: then drop it from ALLOWED_CYCLES, so that it cannot come back unseen."""
    cycles = _strongly_connected(_graph())
    gone = [allowed for allowed in ALLOWED_CYCLES if not any(c <= allowed for c in cycles)]
    if gone:
        pytest.skip("gone, drop from ALLOWED_CYCLES: " + "; ".join(str(sorted(c)) for c in gone))


def test_every_circle_stays_inside_one_folder() -> None:
    for cycle in _strongly_connected(_graph()):
        assert len({module.split(".")[0] for module in cycle}) == 1, sorted(cycle)


def test_no_upward_import() -> None:
    upward = sorted(
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
        and (module, target) not in ALLOWED_UPWARD
    )
    assert not upward, f"upward imports (shared/DESIGN.md, Layout): {upward}"
