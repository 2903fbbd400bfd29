"""`datasetrt docs` (datasetrt/cli/docs.py): every page a docstring names as docs/NAME.md opens by
that very name; the installed package's _docs/ wins over a checkout's docs/; unknown topics list
the topics. (The built wheel's pages: tests/packaging/test_wheels.py and test_installed_wheels.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import datasetrt
from datasetrt.cli import docs
from datasetrt.cli.command import main
from datasetrt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_every_page_a_docstring_names_opens_by_that_name():
    named = set()
    for module in (ROOT / "datasetrt").rglob("*.py"):
        named |= set(re.findall(r"\bdocs/([a-z0-9_-]+\.md)\b", module.read_text()))
    assert len(named) >= 5
    for name in sorted(named):
        assert docs.page(f"docs/{name}") == ROOT / "docs" / name, name


def test_topic_forms_text_and_path(capsys):
    assert docs.topics() == sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    for topic in ("docs/sources.md", "sources.md", "sources"):
        assert main(["docs", topic, "--path"]) == 0
        assert capsys.readouterr().out == f"{ROOT / 'docs' / 'sources.md'}\n"
    assert main(["docs", "sources"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/sources.md").read_text()
    assert main(["docs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(ROOT / "docs") and lines[1:] == docs.topics()


def test_unknown_topics_list_the_topics(capsys):
    assert main(["docs", "nope"]) == 2
    assert "no documentation page 'nope'; the topics are: architecture," in capsys.readouterr().err
    with pytest.raises(ConfigError):
        docs.page("../README")


def test_the_packaged_pages_win_over_a_checkouts(tmp_path, monkeypatch):
    package = tmp_path / "site" / "datasetrt"
    (package / "_docs").mkdir(parents=True)
    (package / "_docs" / "python-api.md").write_text("installed\n")
    (tmp_path / "site" / "docs").mkdir()
    (tmp_path / "site" / "docs" / "other.md").write_text("checkout\n")
    monkeypatch.setattr(datasetrt, "__file__", str(package / "__init__.py"))
    assert docs.docs_dir() == package / "_docs" and docs.topics() == ["python-api"]
    (package / "_docs" / "python-api.md").unlink()
    assert docs.docs_dir() == tmp_path / "site" / "docs"  # an editable install: the checkout's pages
    (tmp_path / "site" / "docs" / "other.md").unlink()
    with pytest.raises(ConfigError, match="no documentation pages found"):
        docs.docs_dir()
