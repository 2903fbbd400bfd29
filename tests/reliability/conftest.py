"""Fixtures of the reliability suite: the fault-injection shim (tests/reliability/faultshim.c),
built once per session with the C compiler the test command already needs for the kernels."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SHIM_SOURCE = Path(__file__).with_name("faultshim.c")


@pytest.fixture(scope="session")
def faultshim(tmp_path_factory) -> Path:
    """Path of the built LD_PRELOAD shim (skips when there is no C compiler; a compile error fails)."""
    compiler = next(
        (found for name in (os.environ.get("CC"), "cc", "gcc", "clang") if name and (found := shutil.which(name))),
        None,
    )
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc or clang; or $CC) to build tests/reliability/faultshim.c")
    out = tmp_path_factory.mktemp("faultshim") / "faultshim.so"
    build = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, f"building {SHIM_SOURCE.name} failed:\n{build.stderr}"
    return out
