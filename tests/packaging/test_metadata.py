"""The package's declared metadata matches its code: dependencies are exactly what it imports,
optional packages are imported lazily and declared in an extra, one version.

The import scan reads every module of datasetrt/ with `ast` (no import executed) and keeps the
top-level names that are neither the standard library nor datasetrt itself, noting whether each
import runs when its module is imported (module level) or only when a function is called (lazy).
An optional package may be imported lazily, or by datasetrt/integrations/ (which the core
imports lazily), never eagerly by the core: that is what keeps `import datasetrt` working
without the extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass

from tests.packaging.conftest import ROOT, version

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEPENDENCIES = PYPROJECT["project"]["dependencies"]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow"}
INTEGRATIONS = "datasetrt/integrations/"


@dataclass(frozen=True)
class Use:
    module: str  # file, e.g. datasetrt/dataset/cached.py
    lazy: bool  # inside a function body


class _Imports(ast.NodeVisitor):
    def __init__(self, rel: str, found: dict[str, set[Use]]) -> None:
        self.rel, self.found, self.depth = rel, found, 0

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, name: str) -> None:
        top = name.split(".")[0]
        if top != "datasetrt" and top not in sys.stdlib_module_names:
            dist = DISTRIBUTION.get(top, top).lower()
            self.found.setdefault(dist, set()).add(Use(self.rel, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module)


def third_party_imports() -> dict[str, set[Use]]:
    """{distribution name: where and how it is imported} over datasetrt/."""
    found: dict[str, set[Use]] = {}
    for path in sorted((ROOT / "datasetrt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        _Imports(rel, found).visit(ast.parse(path.read_text(), rel))
    return found


def names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirements ("torch>=2.0" -> "torch", "ray[data]>=2.9" -> "ray")."""
    return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in requirements}


def eager(uses: set[Use]) -> set[str]:
    return {u.module for u in uses if not u.lazy and not u.module.startswith(INTEGRATIONS)}


def test_dependencies_are_exactly_what_the_package_imports():
    imports = third_party_imports()
    assert names(DEPENDENCIES) <= set(imports), "declared but never imported: " + str(
        names(DEPENDENCIES) - set(imports)
    )
    undeclared = {
        dist: eager(uses) for dist, uses in imports.items() if eager(uses) and dist not in names(DEPENDENCIES)
    }
    assert not undeclared, f"imported when datasetrt loads, yet not a dependency: {undeclared}"


def test_every_optional_import_is_lazy_and_declared_in_an_extra():
    assert {"torch", "ray", "hf", "bench", "dev"} <= set(EXTRAS)
    in_extras = set().union(*(names(reqs) for reqs in EXTRAS.values()))
    for dist, uses in third_party_imports().items():
        if dist in names(DEPENDENCIES):
            continue
        assert dist in in_extras, (dist, uses)
        assert not eager(uses), (dist, uses)


def test_dev_extra_pins_torch_and_leaves_the_numpy_pinning_peers_out():
    """torch==2.13.0 is the build on this machine kind's disk; any range would pull a newer CUDA one.
    bench's mosaicml-streaming pins numpy<2.2, so the tests' extra must not pull it in."""
    assert "torch==2.13.0" in EXTRAS["dev"]
    assert "datasetrt[torch]" in EXTRAS["bench"]
    assert not names(EXTRAS["dev"]) & {"datasetrt", "mosaicml-streaming", "litdata"}


def test_dev_extra_caps_huggingface_hub_where_the_bench_extras_streaming_imports():
    """mosaicml-streaming 0.13 (bench) needs transformers<5, whose import refuses huggingface-hub>=1.0;
    uncapped, dev's datasets resolves to >=5.1, which needs huggingface-hub>=1.31, and Streaming's
    benchmark rows fail to import in the dev venv (docs/benchmarks.md, issue 11)."""
    from packaging.requirements import Requirement

    hub = [Requirement(r) for r in EXTRAS["dev"] if names([r]) == {"huggingface-hub"}]
    assert len(hub) == 1, EXTRAS["dev"]
    assert not hub[0].specifier.contains("1.0") and hub[0].specifier.contains("0.36.2"), hub[0]


def test_version_is_written_once_and_has_a_changelog_entry():
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "datasetrt.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(version())}\b", changelog, re.M), "CHANGELOG.md has no entry for the version"


def test_changelog_lists_every_core_dependency():
    """CHANGELOG.md's "The core install is only what the package imports: ..." names each entry of
    pyproject.toml's dependencies (and nothing stands in for one)."""
    text = " ".join((ROOT / "CHANGELOG.md").read_text().split())
    listed = re.search(r"The core install is only what the package imports: ([^.]*)\.", text)
    assert listed, "CHANGELOG.md no longer lists the core dependencies"
    words = {re.sub(r"\W", "", w).lower() for w in listed.group(1).split()}
    assert names(DEPENDENCIES) <= words, f"missing from CHANGELOG.md: {names(DEPENDENCIES) - words}"
