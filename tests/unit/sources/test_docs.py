"""Every Python block of docs/sources.md runs as pasted (each in a fresh namespace) and its
assertions hold: the page documents the sources and typed-payload API that exists."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "sources.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_an_example_per_source_and_a_typed_one():
    assert len(BLOCKS) >= 7
    assert any("ds.payload_spec.decode(" in block for block in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_as_pasted(index, tmp_path, monkeypatch):
    if "import datasets" in BLOCKS[index]:
        pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' temp dirs land here
    exec(compile(BLOCKS[index], f"{DOC.name}[block {index}]", "exec"), {"__name__": "__docs__"})
