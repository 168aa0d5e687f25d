"""Arrows point down: no import cycle among the project's modules, and no import across the layers.

Layers, top to bottom: `omnigate` (the command dispatcher and the demo) and `bench` (the benchmarks, a
package whose scripts import each other as `bench.x`) may import anything; `loadtest` (the harness) never
imports `omnigate`; `loadtest.sim` (the simulated engine) imports neither `gateway` nor `omnigate`;
`gateway` (the product) imports none of `loadtest`, `bench`, `omnigate`, and does not name them in an
import string either. Every import counts, also inside functions and under `TYPE_CHECKING`: a cycle that
only type checking sees is still two modules that cannot be understood one without the other.

Cycles are looked for twice: between modules, and between parts — a subpackage such as `gateway.admission`
counts as one part, a top-level module such as `gateway.cli` as another — since a subpackage that
imports a module which imports it back is a circle too, whichever of its files each arrow touches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "loadtest", "omnigate", "bench")
FORBIDDEN = {  # importer prefix → imported prefixes it must never reach
    "gateway": ("loadtest", "bench", "omnigate"),
    "loadtest": ("omnigate",),
    "loadtest.sim": ("gateway", "omnigate"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, resolved to a module of `known` if it is one."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in known else base), node.lineno


def _strings(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, node.lineno


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: {
            imported for imported, _ in _imports(name, path, known) if imported in known and imported != name
        }
        for name, path in modules.items()
    }


def _part(module: str) -> str:
    """`gateway.admission.queue` → `gateway.admission`; `gateway.cli` stays itself."""
    return ".".join(module.split(".")[:2])


def _parts(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        part = _part(module)
        out.setdefault(part, set()).update(_part(i) for i in imported if _part(i) != part)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path_through(component: list[str], graph: dict[str, set[str]]) -> str:
    """One concrete cycle inside a component, as `a → b → … → a`, for the failure message."""
    members = set(component)
    start = component[0]
    trail, seen, node = [start], {start}, start
    while True:
        node = sorted(graph[node] & members)[0] if graph[node] & members else start
        if node in seen or node == start:
            return " → ".join([*trail, node])
        trail.append(node)
        seen.add(node)


def test_cycle_finder_reports_each_circle_once() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert _path_through(["a", "b", "c"], graph) == "a → b → c → a"


def test_relative_and_function_level_imports_are_resolved(tmp_path: Path) -> None:
    source = "from . import sibling\nfrom .sub import thing\n\ndef f():\n    import gateway.late\n"
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = {"gateway.pkg.sibling", "gateway.pkg.sub", "gateway.late"}
    found = sorted(i for i, _ in _imports("gateway.pkg.mod", path, known))
    assert found == ["gateway.late", "gateway.pkg.sibling", "gateway.pkg.sub"]


def test_no_import_cycles() -> None:
    cycles = sorted(_path_through(c, graph) for graph in (_graph(), _parts(_graph())) for c in _cycles(graph))
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_no_import_crosses_a_layer() -> None:
    modules = _modules()
    known = set(modules)
    wrong = []
    for name, path in modules.items():
        rules = [
            banned for prefix, banned in FORBIDDEN.items() if name == prefix or name.startswith(prefix + ".")
        ]
        for imported, line in _imports(name, path, known):
            for banned in (b for group in rules for b in group):
                if imported == banned or imported.startswith(banned + "."):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert wrong == []


def test_the_product_names_no_harness_module_in_an_import_string() -> None:
    """`importlib.import_module("loadtest.cli")` is an import too, whatever the AST calls it."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} {text!r}"
        for name, path in _modules().items()
        if name.split(".")[0] == "gateway"
        for text, line in _strings(path)
        if text.split(".")[0] in ("loadtest", "bench") and " " not in text
    ]
    assert wrong == []
