"""setup.py's link decisions (codec_build_args), without building: static archives hidden in the
modules, xxhash from libxxhash.a or compiled in from its header, shared libraries on request.

setup.py runs setup() only as __main__, so it is loaded here as a plain module.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.packaging.conftest import load_setup_py


@pytest.fixture(scope="module")
def setup_py():
    return load_setup_py()


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Fake include and lib dirs with the three headers; returns (include, lib)."""
    include, lib = tmp_path / "include", tmp_path / "lib"
    include.mkdir()
    lib.mkdir()
    for header in ("lz4.h", "zstd.h", "xxhash.h"):
        (include / header).write_text("")
    monkeypatch.setenv("DATASETRT_INCLUDE_DIRS", str(include))
    monkeypatch.setenv("DATASETRT_LIBRARY_DIRS", str(lib))
    monkeypatch.delenv("DATASETRT_LINK", raising=False)
    return include, lib


def touch(lib: Path, *names: str) -> list[str]:
    for name in names:
        (lib / name).write_bytes(b"")
    return [str(lib / name) for name in names]


def test_static_archives_are_linked_hidden_with_xxhash_from_its_archive(setup_py, dirs):
    include, lib = dirs
    archives = touch(lib, "liblz4.a", "libzstd.a", "libxxhash.a")
    args = setup_py.codec_build_args()
    assert args["extra_objects"] == archives
    assert args["extra_link_args"] == ["-Wl,--exclude-libs,ALL"]
    assert args["define_macros"] == []
    assert args["include_dirs"] == [str(include)]
    assert "libraries" not in args


def test_without_libxxhash_a_xxh3_is_compiled_in_from_the_header(setup_py, dirs):
    _, lib = dirs
    archives = touch(lib, "liblz4.a", "libzstd.a")
    args = setup_py.codec_build_args()
    assert args["extra_objects"] == archives
    assert args["define_macros"] == [("XXH_INLINE_ALL", None)]


@pytest.mark.parametrize("mode", ["auto", "shared"])
def test_shared_libraries_when_asked_or_when_auto_finds_no_archive(setup_py, dirs, monkeypatch, mode):
    _, lib = dirs
    if mode == "shared":
        touch(lib, "liblz4.a", "libzstd.a", "libxxhash.a")
    monkeypatch.setenv("DATASETRT_LINK", mode)
    args = setup_py.codec_build_args()
    assert args["libraries"] == ["lz4", "zstd", "xxhash"]
    assert args["library_dirs"] == [str(lib)]
    assert "extra_objects" not in args and "define_macros" not in args


def test_an_unknown_link_mode_stops_with_one_line(setup_py, dirs, monkeypatch, capsys):
    monkeypatch.setenv("DATASETRT_LINK", "dynamic")
    with pytest.raises(SystemExit) as stop:
        setup_py.codec_build_args()
    assert stop.value.code == 1
    assert capsys.readouterr().err == "datasetrt build: DATASETRT_LINK='dynamic': expected static, shared or auto\n"


def test_default_header_search_reads_cpath_then_system_dirs(setup_py, monkeypatch):
    monkeypatch.delenv("DATASETRT_INCLUDE_DIRS", raising=False)
    monkeypatch.setenv("CPATH", os.pathsep.join(["/opt/a/include", "/opt/b/include"]))
    monkeypatch.delenv("C_INCLUDE_PATH", raising=False)
    assert setup_py.include_dirs() == ["/opt/a/include", "/opt/b/include", "/usr/local/include", "/usr/include"]
