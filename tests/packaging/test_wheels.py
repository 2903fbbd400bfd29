"""The built wheels are self-contained: tags, auditwheel's verdict, and each extension's links.

A wheel passes when its tag names its CPython version and a manylinux policy, `auditwheel show`
finds it consistent with that policy and reports no external library beyond the policy's
(libc, libpthread, ...), and every compiled module links no codec shared library (ldd), exports
only Python's symbols (PyInit_ and Cython's module flag: the static codecs stay hidden) and
carries no text relocations and no run path.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, TAG, VERSIONS, load_setup_py, run, version

pytestmark = pytest.mark.wheels

KERNELS = load_setup_py().KERNELS
CODEC_LIBS = re.compile(r"lib(lz4|zstd|xxhash)")
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0"}


def extract_extensions(wheel: Path, into: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith("datasetrt/_native/") and n.endswith(".so")]
        zf.extractall(into, members=names)
    return sorted(into / n for n in names)


@pytest.mark.parametrize("py", VERSIONS)
def test_wheel_is_tagged_for_its_cpython_and_a_manylinux_policy(built, py):
    name = built.wheels[py].name
    assert re.fullmatch(rf"datasetrt-{re.escape(version())}-{TAG[py]}-{TAG[py]}-manylinux_2_\d+_x86_64\.whl", name), (
        name
    )


@pytest.mark.parametrize("py", VERSIONS)
def test_auditwheel_show_finds_no_external_library(built, auditwheel, py):
    out = " ".join(run([auditwheel, "show", built.wheels[py]]).stdout.split())
    policy = re.search(r"manylinux_2_\d+_x86_64", built.wheels[py].name).group(0)
    assert f'is consistent with the following platform tag: "{policy}"' in out, out
    assert "external shared libraries are required" not in out, out
    system = re.search(r"system-provided shared libraries: (.*?) This constrains", out).group(1)
    assert set(re.findall(r"(\S+\.so\.\d+) with versions", system)) <= SYSTEM_LIBS, out
    assert not CODEC_LIBS.search(out), out


@pytest.mark.parametrize("py", VERSIONS)
def test_each_extension_links_no_codec_library_and_exports_only_python_symbols(built, py, tmp_path):
    sos = extract_extensions(built.wheels[py], tmp_path)
    assert sorted(so.name.split(".")[0] for so in sos) == sorted(KERNELS)
    for so in sos:
        kernel = so.name.split(".")[0]
        ldd = run(["ldd", so]).stdout
        assert not CODEC_LIBS.search(ldd), f"{so.name}:\n{ldd}"
        dynamic = run(["readelf", "-d", so]).stdout
        assert set(re.findall(r"NEEDED.*\[(.+)\]", dynamic)) <= SYSTEM_LIBS, (so.name, dynamic)
        for tag in ("TEXTREL", "RPATH", "RUNPATH"):
            assert f"({tag})" not in dynamic, (so.name, dynamic)
        exported = set(run(["nm", "-D", "--defined-only", so]).stdout.split()[2::3])
        assert exported == {f"PyInit_{kernel}", f"__pyx_module_is_main_datasetrt___native__{kernel}"}, exported


def test_codecs_are_compiled_into_the_kernels_that_use_them(built, tmp_path):
    """No codec symbol is left for the dynamic linker (CPython loads modules with RTLD_NOW, so one
    would fail the import); zstd's own error strings sit in codec and gather. Allowed: zstd's weak
    optional tracing hooks (ZSTD_trace_*), which stay null unless a tracer defines them."""
    for so in extract_extensions(built.wheels[VERSIONS[0]], tmp_path):
        undefined = run(["nm", "-D", "--undefined-only", so]).stdout.splitlines()
        codec_refs = [line for line in undefined if re.search(r"LZ4|ZSTD|XXH", line)]
        assert all(re.fullmatch(r"\s+w ZSTD_trace_\w+", line) for line in codec_refs), (so.name, codec_refs)
        has_zstd = b"Unknown frame descriptor" in so.read_bytes()
        assert has_zstd == so.name.startswith(("codec.", "gather.")), so.name


@pytest.mark.parametrize("py", VERSIONS)
def test_wheel_carries_the_package_and_entry_point_only(built, py):
    with zipfile.ZipFile(built.wheels[py]) as zf:
        names = zf.namelist()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names} == {"datasetrt", f"datasetrt-{version()}.dist-info"}, names
    assert not [n for n in names if n.endswith((".pyx", ".pxd", ".c", ".pyc"))]
    assert "datasetrt = datasetrt.cli:main" in entry_points
    assert f"Version: {version()}" in metadata
    assert "Requires-Python: >=3.11" in metadata


@pytest.mark.parametrize("py", VERSIONS)
def test_wheel_carries_every_documentation_page(built, py):
    """docs/*.md ship as package data (datasetrt/_docs/), byte for byte: `datasetrt docs TOPIC`."""
    with zipfile.ZipFile(built.wheels[py]) as zf:
        shipped = {
            n.removeprefix("datasetrt/_docs/"): zf.read(n)
            for n in zf.namelist()
            if n.startswith("datasetrt/_docs/") and not n.endswith("/")
        }
    pages = {p.name: p.read_bytes() for p in sorted((ROOT / "docs").glob("*.md"))}
    assert pages and shipped == pages
