"""The kernels' type stubs (datasetrt/_native/*.pyi) against the compiled modules, so they cannot
drift: every compiled module has a stub; a stub names exactly the functions and classes its module
defines, each class exactly its public methods and attributes, and each function and method the
same parameters; every module variable a stub declares exists."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import datasetrt._native

NATIVE = Path(datasetrt._native.__file__).parent
KERNELS = sorted(info.name for info in pkgutil.iter_modules(datasetrt._native.__path__) if not info.ispkg)
STUB_ONLY = {"_buffers"}  # types shared by the stubs, with no compiled module


def _public(name: str) -> bool:
    return not name.startswith("_")


def _stub(kernel: str) -> ast.Module:
    return ast.parse((NATIVE / f"{kernel}.pyi").read_text())


def _params(node: ast.FunctionDef) -> list[str]:
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _members(body: list[ast.stmt]) -> tuple[dict[str, ast.AST], set[str]]:
    """(functions and classes by name, annotated or assigned variables) of a stub body."""
    defs: dict[str, ast.AST] = {}
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return defs, names


def _defined(module) -> dict[str, object]:
    """The public functions and classes the compiled module itself defines (not its imports)."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if _public(name) and callable(obj) and getattr(obj, "__module__", None) == module.__name__
    }


def test_every_compiled_module_has_a_stub_and_every_stub_a_module():
    stubs = {p.stem for p in NATIVE.glob("*.pyi")}
    assert KERNELS and stubs - STUB_ONLY == set(KERNELS)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_stub_names_what_its_module_defines(kernel):
    module = importlib.import_module(f"datasetrt._native.{kernel}")
    defs, variables = _members(_stub(kernel).body)
    public = {name for name in defs if _public(name)}
    assert public == set(_defined(module)), kernel
    for name in variables:
        assert not _public(name) or hasattr(module, name), f"{kernel}.{name}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_stub_signatures_and_class_members_match(kernel):
    module = importlib.import_module(f"datasetrt._native.{kernel}")
    defs, _ = _members(_stub(kernel).body)
    for name, obj in _defined(module).items():
        node = defs[name]
        if isinstance(node, ast.FunctionDef):
            assert _params(node) == list(inspect.signature(obj).parameters), f"{kernel}.{name}"
            continue
        assert isinstance(node, ast.ClassDef) and inspect.isclass(obj), f"{kernel}.{name}"
        members, attributes = _members(node.body)
        stub_names = {n for n in (*members, *attributes) if _public(n)}
        assert stub_names == {n for n in vars(obj) if _public(n)}, f"{kernel}.{name}"
        for member, method in members.items():
            runtime = vars(obj).get(member)
            if isinstance(method, ast.FunctionDef) and callable(runtime) and _public(member):
                assert _params(method) == list(inspect.signature(runtime).parameters), f"{kernel}.{name}.{member}"
