"""`datasetrt docs [TOPIC]`: the documentation pages that docstrings name as `docs/NAME.md`, opened
from an installed package.

Boundary: files only: the pages the wheel ships as package data (`datasetrt/_docs/*.md`, copied
from the checkout's docs/ by setup.py's build_py and sdist), or, in a source checkout (an editable
install), the checkout's own docs/. No other layer imports this module.

  datasetrt docs                      the pages' directory and every topic, one a line
  datasetrt docs TOPIC                one page's Markdown on stdout; TOPIC as a docstring writes it
                                      ("docs/python-api.md"), or "python-api.md", or "python-api"
  datasetrt docs TOPIC --path         the page's path instead (open it in any viewer)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import datasetrt
from datasetrt.errors import ConfigError

SUMMARY = "the documentation pages docstrings name as docs/NAME.md: list them, print one, or its --path"
PACKAGED = "_docs"  # inside the package (setup.py's build_py and sdist put the pages there)


def docs_dir() -> Path:
    """The directory holding the pages: the installed package's `_docs/`, else the source
    checkout's `docs/` (an editable install). ConfigError when neither exists."""
    package = Path(datasetrt.__file__).resolve().parent
    for candidate in (package / PACKAGED, package.parent / "docs"):
        if any(candidate.glob("*.md")):
            return candidate
    raise ConfigError(f"no documentation pages found in {package / PACKAGED} (this installation carries none)")


def topics() -> list[str]:
    """Every page's topic (file name without .md), sorted."""
    return sorted(p.stem for p in docs_dir().glob("*.md"))


def page(topic: str) -> Path:
    """The page `topic` names ("docs/NAME.md", "NAME.md" or "NAME"); ConfigError listing the topics when
    there is none."""
    name = topic.strip().removeprefix("docs/").removesuffix(".md")
    path = docs_dir() / f"{name}.md"
    if "/" in name or not path.is_file():
        raise ConfigError(f"no documentation page {topic!r}; the topics are: {', '.join(topics())}")
    return path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="list, print or locate the documentation pages (docs/NAME.md)", description=SUMMARY)
    p.add_argument("topic", nargs="?", metavar="TOPIC", help='e.g. "python-api" or "docs/python-api.md"')
    p.add_argument("--path", action="store_true", help="print the page's path instead of its text")


def run(args: argparse.Namespace) -> int:
    try:
        if args.topic is None:
            print(docs_dir())
            print("\n".join(topics()))
            return 0
        path = page(args.topic)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0
