"""Each wheel installed into a fresh venv (binaries only, no compiler on PATH) works outside the
repository: the smoke script (tests/packaging/wheel_smoke.py: write, read with fork and spawn
workers, batches, checksums, a missing extra) and the console command (--version, demo).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, VERSIONS, run, version

pytestmark = pytest.mark.wheels


@pytest.mark.parametrize("py", VERSIONS)
def test_installed_wheel_writes_reads_with_workers_and_verifies(installed_venv, py, tmp_path):
    venv, env = installed_venv(py)
    script = tmp_path / "wheel_smoke.py"
    shutil.copy(ROOT / "tests/packaging/wheel_smoke.py", script)  # nothing else from the repository
    proc = run([venv / "bin/python", script, version(), tmp_path / "work"], cwd=tmp_path, env=env)
    assert proc.stdout.splitlines()[-1] == "wheel smoke ok", proc.stdout
    for start_method in ("fork", "spawn"):
        assert f"read 600 samples and 600 as batches with 2 {start_method} workers" in proc.stdout
    assert not (tmp_path / "work/caches").exists()


@pytest.mark.parametrize("py", VERSIONS)
def test_console_command_prints_version_and_runs_the_demo(installed_venv, py, tmp_path):
    venv, env = installed_venv(py)
    assert run([venv / "bin/datasetrt", "--version"], cwd=tmp_path, env=env).stdout == f"datasetrt {version()}\n"
    # the pages docstrings name as docs/NAME.md open from the installed package, not the checkout
    page = Path(
        run([venv / "bin/datasetrt", "docs", "docs/python-api.md", "--path"], cwd=tmp_path, env=env).stdout.strip()
    )
    assert page.is_relative_to(venv) and page.read_bytes() == (ROOT / "docs/python-api.md").read_bytes()
    demo = run(
        [
            venv / "bin/datasetrt",
            "demo",
            "--caches",
            "2",
            "--samples",
            "1500",
            "--payload-bytes",
            "1024",
            "--workdir",
            tmp_path / "demo",
        ],
        cwd=tmp_path,
        env=env,
    ).stdout
    lines = demo.splitlines()
    assert lines[0].startswith("wrote 2 caches, 3,000 samples"), demo
    assert any(line.startswith("metadata: 3,000 rows -> ") for line in lines), demo
    assert any(line.startswith("read ") and "samples/s" in line for line in lines), demo
    assert any(line.startswith("read ") and "as batches of 256" in line for line in lines), demo
    assert any(line.startswith("process-tree PSS (parent + 2 reader workers)") for line in lines), demo
    for part in ("part0", "part1"):
        assert (tmp_path / "demo/caches" / part / "manifest.json").is_file(), part


def test_python_m_demo_runs_from_the_installed_package(installed_venv, tmp_path):
    venv, env = installed_venv(VERSIONS[-1])
    out = run(
        [venv / "bin/python", "-m", "datasetrt.cli.demo", "--caches", "1", "--samples", "400", "--workers", "1"],
        cwd=tmp_path,
        env=env,
    ).stdout
    assert out.startswith("wrote 1 caches, 400 samples"), out
    assert "process-tree PSS (parent + 1 reader workers)" in out, out
