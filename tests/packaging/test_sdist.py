"""The sdist: what it carries, and that building it without the codec headers stops at once with
one line naming the packages to install.

"At once" is checked by what did not happen: Cython generated no C file and no compiler ran (no
object file under build/), so the failure cost nothing but reading setup.py.
DATASETRT_INCLUDE_DIRS (honoured by setup.py) points the header search at an empty directory,
which is what a machine without liblz4-dev/libzstd-dev/libxxhash-dev looks like to the build.
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest

from tests.packaging.conftest import run, version

pytestmark = pytest.mark.wheels

MISSING_LINE = (
    "datasetrt build: missing codec header(s) lz4.h, zstd.h, xxhash.h (searched {dirs}); "
    "install liblz4-dev libzstd-dev libxxhash-dev (Debian/Ubuntu) or "
    "lz4-devel libzstd-devel xxhash-devel (Fedora/RHEL), or point DATASETRT_INCLUDE_DIRS at them"
)


@pytest.fixture
def unpacked(built, tmp_path) -> Path:
    with tarfile.open(built.sdist) as tf:
        tf.extractall(tmp_path, filter="data")
    return tmp_path / f"datasetrt-{version()}"


def no_build_products(src: Path) -> None:
    assert not list(src.glob("_ext/*.c")), "Cython ran before the header check"
    assert not list(src.rglob("*.o")) and not list(src.rglob("*.so")), "the compiler ran"


def test_sdist_carries_sources_and_no_build_products(built):
    with tarfile.open(built.sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for needed in (
        "setup.py",
        "pyproject.toml",
        "MANIFEST.in",
        "README.md",
        "CHANGELOG.md",
        "_ext/clibs.pxd",
        "_ext/gather.pyx",
        "_ext/xxh3_wide.h",
        "datasetrt/__init__.py",
        "datasetrt/cli/demo.py",
        "datasetrt/_native/__init__.py",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.endswith((".c", ".so", ".pyc"))]
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/", "docs/"))]


def test_build_without_headers_fails_with_one_line_naming_the_packages(unpacked, tmp_path):
    empty = tmp_path / "empty-include"
    empty.mkdir()
    env = {**os.environ, "DATASETRT_INCLUDE_DIRS": str(empty)}
    proc = run([sys.executable, "setup.py", "-q", "build_ext"], cwd=unpacked, env=env, check=False)
    assert proc.returncode == 1, proc
    assert proc.stderr.splitlines() == [MISSING_LINE.format(dirs=empty)], proc.stderr
    no_build_products(unpacked)


def test_pip_install_of_the_sdist_without_headers_shows_the_line(built, tmp_path):
    """What a user sees: pip's own framing around the build's single line, no compiler output."""
    empty = tmp_path / "empty-include"
    empty.mkdir()
    env = {**os.environ, "DATASETRT_INCLUDE_DIRS": str(empty)}
    proc = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path / "out",
            built.sdist,
        ],
        env=env,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert MISSING_LINE.format(dirs=empty) in output, output
    assert "Traceback" not in output and "gcc" not in output and "error: command" not in output, output
    assert not list((tmp_path / "out").glob("*.whl"))


def test_static_link_without_archives_fails_with_one_line(unpacked, tmp_path):
    empty = tmp_path / "empty-lib"
    empty.mkdir()
    env = {**os.environ, "DATASETRT_LINK": "static", "DATASETRT_LIBRARY_DIRS": str(empty)}
    proc = run([sys.executable, "setup.py", "-q", "build_ext"], cwd=unpacked, env=env, check=False)
    assert proc.returncode == 1, proc
    [line] = proc.stderr.splitlines()
    assert line.startswith("datasetrt build: DATASETRT_LINK=static but liblz4.a, libzstd.a not found in"), line
    assert "liblz4-dev libzstd-dev (Debian/Ubuntu)" in line
    no_build_products(unpacked)
