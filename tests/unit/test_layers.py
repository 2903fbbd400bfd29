"""The package's import graph against docs/architecture.md: no import cycle between datasetrt
modules, no import from a higher layer, and nothing heavy in what a reader worker imports.

Every import statement counts — at module level, inside functions (lazy imports), in try blocks
and under `if TYPE_CHECKING:` (a type-only import is still a dependency a reader must follow).
The graph is read from the source (AST), so a new module or import is checked without running it.
Edges under TYPE_CHECKING are never executed, so they count for layers and cycles but not for what
a process imports (`_eager_closure`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import datasetrt

ROOT = Path(datasetrt.__file__).resolve().parent
PKG = ROOT.name

# docs/architecture.md, "Layers": a module imports only from its own layer or below. The longest
# matching prefix decides; a module no entry covers fails `test_every_module_has_a_layer`.
LAYERS = {
    "datasetrt.errors": 0,
    "datasetrt.values": 1,  # configs, codec table, payload rules, typed views, plain records
    "datasetrt._native": 1,
    "datasetrt.format": 2,
    "datasetrt.storage": 2,
    "datasetrt.sources": 2,
    "datasetrt.table": 3,
    "datasetrt.sampling": 3,
    "datasetrt.runtime": 4,
    "datasetrt.dataset": 5,
    "datasetrt.api": 5,
    "datasetrt": 5,  # the package root: lazy re-export of datasetrt.api
    # dataset-rt's API puts to_torch_* on the dataset, so the torch adapters are a dependency of
    # the dataset (lazily imported) and sit in its layer; they see a dataset only through the seam
    # protocol (test_torch_integration_uses_only_the_dataset_seam), so no cycle can form.
    "datasetrt.integrations.torch": 5,
    "datasetrt.integrations": 6,
    "datasetrt.ray": 6,  # the public name of integrations.ray
    "datasetrt.cli": 7,
    "datasetrt.__main__": 7,  # python -m datasetrt: the console command
}
TORCH_PACKAGE = "datasetrt.integrations.torch"
TORCH_MAY_IMPORT = {
    "datasetrt.errors",
    "datasetrt.values.config",
    "datasetrt.values.records",
    "datasetrt.dataset.seam",
    "datasetrt._native.draws",  # derive_seed: dataset-rt's per-rank/worker seed rule
    "datasetrt.values.arrays",  # RaggedArrays and the pad check of SampleBatch.to_numpy (to_torch_batches)
}
TORCH_FREE = (f"{TORCH_PACKAGE}.plan", f"{TORCH_PACKAGE}.spawn", f"{TORCH_PACKAGE}.options")
WORKER_ENTRY = "datasetrt.runtime.worker"
HEAVY = ("numpy", "polars", "pyarrow", "torch", "pandas")


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str  # a datasetrt module, or a top-level third-party name
    lazy: bool  # inside a function body
    line: int
    type_only: bool = False  # under `if TYPE_CHECKING:` (never executed)


def _modules() -> dict[str, Path | None]:
    """datasetrt module name -> source file (None for compiled extension modules)."""
    mods: dict[str, Path | None] = {}
    for path in ROOT.rglob("*"):
        if path.suffix == ".py":
            parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
        elif path.suffix in (".so", ".pyd"):
            rel = path.relative_to(ROOT.parent)
            mods[".".join([*rel.parent.parts, path.name.split(".")[0]])] = None
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.depth = 0  # function nesting
        self.typing = 0  # `if TYPE_CHECKING:` nesting
        self.edges: list[Edge] = []

    def _add(self, target: str, node: ast.AST) -> None:
        self.edges.append(Edge(self.module, target, self.depth > 0, node.lineno, self.typing > 0))

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            self.typing += 1
            for child in node.body:
                self.visit(child)
            self.typing -= 1
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == PKG:
                self._add(_resolve(alias.name), node)
            else:
                self._add(alias.name.split(".")[0], node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module.split(".")[0] != PKG:
            self._add(module.split(".")[0], node)
            return
        for alias in node.names:
            child = f"{module}.{alias.name}"
            self._add(child if child in MODULES else _resolve(module), node)


def _edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        if path is None:
            continue
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        edges += [e for e in visitor.edges if e.target != module]
    return edges


EDGES = _edges()


def layer_of(module: str) -> int | None:
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return None


def _internal(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if e.target in MODULES]


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_no_import_from_a_higher_layer():
    bad = []
    for e in _internal(EDGES):
        if layer_of(e.target) > layer_of(e.importer):
            bad.append(
                f"{e.importer}:{e.line} (layer {layer_of(e.importer)}) imports {e.target} (layer {layer_of(e.target)})"
            )
    assert bad == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_strongly_connected_finds_a_cycle():
    """The checker itself: a planted cycle (lazy edges count as well) is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in _internal(EDGES):
        # a package re-exporting its own children is not a dependency cycle of substance
        if not (
            MODULES[e.importer] is not None
            and MODULES[e.importer].name == "__init__.py"
            and e.target.startswith(e.importer + ".")
        ):
            graph[e.importer].add(e.target)
    assert strongly_connected(graph) == []


def _eager_closure(entry: str) -> set[str]:
    """Modules imported when `entry` is imported: module-level imports, transitively, plus the
    packages that contain each module (their __init__ runs first)."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for k in range(1, len(parts) + 1):
            name = ".".join(parts[:k])
            if name in MODULES and name not in seen:
                seen.add(name)
                todo += [e.target for e in _internal(EDGES) if e.importer == name and not e.lazy and not e.type_only]
    return seen


def test_reader_worker_imports_nothing_heavy_at_module_level():
    """What `runtime.worker` pulls in when a spawned worker starts must not import numpy,
    Polars, pyarrow, torch or pandas at module level (tests/runtime check the live workers)."""
    closure = _eager_closure(WORKER_ENTRY)
    assert {"datasetrt.runtime.slot", "datasetrt.runtime.gatherer"} <= closure
    heavy = [
        f"{e.importer}:{e.line} imports {e.target}"
        for e in EDGES
        if e.importer in closure and not e.lazy and not e.type_only and e.target in HEAVY
    ]
    assert heavy == []


@pytest.mark.parametrize("module", ["datasetrt.runtime.ring", "datasetrt.runtime.run", "datasetrt.runtime.local"])
def test_parent_side_runtime_modules_stay_out_of_the_worker(module):
    assert module not in _eager_closure(WORKER_ENTRY)


def test_torch_integration_uses_only_the_dataset_seam():
    bad = [
        f"{e.importer}:{e.line} imports {e.target}"
        for e in _internal(EDGES)
        if e.importer.startswith(TORCH_PACKAGE)
        and not e.target.startswith(TORCH_PACKAGE)
        and e.target not in TORCH_MAY_IMPORT
    ]
    assert bad == []


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_planning_modules_import_no_torch(module):
    """Importing them (and so their package, whose exports are lazy) loads no torch."""
    closure = _eager_closure(module)
    assert TORCH_PACKAGE in closure
    assert [
        f"{e.importer}:{e.line}"
        for e in EDGES
        if e.importer in closure and not e.lazy and not e.type_only and e.target == "torch"
    ] == []
