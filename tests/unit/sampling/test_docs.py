"""Every Python block of docs/sampling.md runs as pasted (each in a fresh namespace) and its
assertions hold: the page documents the planner API that exists."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "sampling.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_as_pasted(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' temp dirs land here
    exec(compile(BLOCKS[index], f"{DOC.name}[block {index}]", "exec"), {"__name__": "__docs__"})
