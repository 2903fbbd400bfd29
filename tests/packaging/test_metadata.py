"""The package's declared metadata matches its code: dependencies are exactly what it imports,
optional packages are imported only by integrations and declared in an extra, one version.

The import scan reads every module of datasetrt/ with `ast` (no import executed) and keeps the
top-level names that are neither the standard library nor datasetrt itself.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from tests.packaging.conftest import ROOT, version

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow"}
EXTRAS = ("torch", "ray", "hf", "bench", "dev")


def third_party_imports(exclude: str | None = None) -> dict[str, set[str]]:
    """{import name: {module paths importing it}} over datasetrt/ (skipping paths under `exclude`)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "datasetrt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if exclude and rel.startswith(exclude):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "datasetrt" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(rel)
    return found


def names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirements ("torch>=2.0" -> "torch", "ray[data]>=2.9" -> "ray")."""
    return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in requirements}


def test_dependencies_are_exactly_the_core_imports():
    core = third_party_imports(exclude="datasetrt/integrations/")
    assert {DISTRIBUTION.get(m, m).lower() for m in core} == names(PYPROJECT["project"]["dependencies"]), core


def test_integration_imports_are_declared_in_an_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    declared = set().union(*(names(reqs) for reqs in extras.values())) | names(PYPROJECT["project"]["dependencies"])
    for module, where in third_party_imports().items():
        assert DISTRIBUTION.get(module, module).lower() in declared, (module, where)


def test_optional_packages_are_imported_only_by_integrations():
    core = names(PYPROJECT["project"]["dependencies"])
    for module, where in third_party_imports().items():
        if DISTRIBUTION.get(module, module).lower() not in core:
            assert all(w.startswith("datasetrt/integrations/") for w in where), (module, where)


def test_dev_extra_pins_torch_and_builds_on_bench():
    """torch==2.13.0 is the build on this machine kind's disk; any range would pull a newer CUDA one."""
    dev = PYPROJECT["project"]["optional-dependencies"]["dev"]
    assert "torch==2.13.0" in dev
    assert "datasetrt[bench]" in dev and "datasetrt[torch]" in PYPROJECT["project"]["optional-dependencies"]["bench"]


def test_version_is_written_once_and_has_a_changelog_entry():
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "datasetrt.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(version())}\b", changelog, re.M), "CHANGELOG.md has no entry for the version"
