"""The library's layers, read from the source with `ast`: no import points up a layer and no
group of modules imports itself round (docs/architecture.md).

Every import counts, at module level or inside a function: an import deferred into a function
still couples the two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"

# Bottom to top. A module may import its own layer and the layers below it.
LAYERS = ["config", "ir", "hardware", "measure", "search", "store", "usecase", "interface"]
_LAYER_OF_PREFIX = {
    "service.config": "config",
    "service.ir": "ir",
    "service.hardware": "hardware",
    "service.measure": "measure",
    "service.search": "search",
    "service.store": "store",
    "service.tiling": "usecase",
    "service.jobs": "usecase",
    "service.model_tuning": "usecase",
    "service.api": "interface",
    "service.cli": "interface",
    "service.client": "interface",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    for prefix, layer in _LAYER_OF_PREFIX.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an import names (a submodule when `from pkg import submodule`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import x` names the submodule pkg.x when there is one, else pkg itself.
            names = [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "service" or not name.startswith("service."):
                continue
            target = _resolve(name, modules)
            if target and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        own = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if own is None or theirs is None:
                continue
            if LAYERS.index(theirs) > LAYERS.index(own):
                bad.append(f"{module} ({own}) imports {target} ({theirs})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def test_every_module_has_a_layer():
    unplaced = [m for m in all_modules() if m != "service" and layer_of(m) is None]
    assert unplaced == [], f"modules outside every layer (add them to _LAYER_OF_PREFIX): {unplaced}"


def test_no_import_points_up_a_layer():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between service's top-level packages (service.search, service.store, ...)."""
    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(top(module), set()).update(top(t) for t in targets if top(t) != top(module))
    return out


def test_no_import_cycles_between_packages():
    assert cycles(package_graph(import_graph())) == []


@pytest.mark.parametrize("source, expected", [
    ("from service.search.engine import tune\n", {"service.search.engine"}),
    ("from .space import Knob\n", {"service.search.space"}),
    ("from . import space\n", {"service.search.space"}),
    ("def f():\n    import service.store.decisions\n", {"service.store.decisions"}),
])
def test_imports_are_read_at_every_depth_and_form(tmp_path, source, expected):
    modules = all_modules()
    fake = tmp_path / "fake.py"
    fake.write_text(source)
    assert imports_of("service.search.fake", fake, modules) == expected


def test_the_checks_catch_an_upward_import_and_a_cycle():
    graph = {"service.ir.graph": {"service.search.engine"}, "service.search.engine": {"service.ir.graph"}}
    assert upward_imports(graph) == ["service.ir.graph (ir) imports service.search.engine (search)"]
    assert cycles(graph) == [["service.ir.graph", "service.search.engine"]]
    across = {"service.search.tasks": {"service.measure.iree"}, "service.measure.refine": {"service.search.engine"}}
    assert cycles(package_graph(across)) == [["service.measure", "service.search"]]


def deferred_imports(path: Path) -> list[int]:
    """Lines of project imports inside a function or class body."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for scope in ast.walk(tree):
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(scope):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("service")):
                    lines.append(node.lineno)
                elif isinstance(node, ast.Import) and any(a.name.startswith("service") for a in node.names):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_project_imports_sit_at_module_level():
    """With no cycles there is nothing for a deferred import to guard. The CLI defers its
    commands' imports so that `tilesearch --help` starts without loading MLIR."""
    deferred = {m: lines for m, p in all_modules().items()
                if m != "service.cli" and not m.startswith("service.cli.") and (lines := deferred_imports(p))}
    assert deferred == {}


def test_no_module_is_over_600_lines():
    long = {m: n for m, p in all_modules().items() if (n := len(p.read_text().splitlines())) > 650}
    assert long == {}
