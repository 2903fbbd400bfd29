"""Code blocks of the Markdown docs: which ones run, and running them (tests/docs/test_doc_blocks.py).

A fenced block tagged `python` runs as a script; one tagged `bash` or `sh` runs in bash with
`-e -o pipefail`. Untagged blocks (output, diagrams) and other languages are text. A runnable block
is skipped only when the nearest non-blank line above it is `<!-- doc-test: skip REASON -->` (the
reason is required). All blocks of one file run in order in one subprocess (this module run as a
script), in one temporary working directory, as a reader pasting them top to bottom would; each
Python block is its own `__main__` module (its own namespace and file, so processes it spawns
re-import it as a user's script would be), so a block must define what it uses.

The working directory links the checkout's top-level entries (`.venv`, `scripts`, `benchmarks`,
the package, ...) so commands written for a checkout resolve, while whatever a block writes
(`caches/`, `*.csv`) lands in the temporary directory; the environment's `bin` is first on PATH
(`python`, `datasetrt`).
"""

from __future__ import annotations

import builtins
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash"}
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
SKIP = re.compile(r"^<!--\s*doc-test:\s*skip\b\s*(.*?)\s*-->$")
LINKED = (
    ".venv",
    "scripts",
    "benchmarks",
    "datasetrt",
    "_ext",
    "docs",
    "tests",
    "README.md",
    "pyproject.toml",
    "setup.py",
)


@dataclass(frozen=True)
class Block:
    """One fenced block: `line` is the 1-based line of its opening fence."""

    lang: str
    line: int
    code: str
    skip: str | None  # the skip reason, or None

    @property
    def kind(self) -> str | None:
        return RUNNABLE.get(self.lang)


def parse(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order. Raises ValueError for an unclosed fence or
    a skip marker without a reason."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"line {start + 1}: unclosed code fence")
        above = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.match(above)
        if skip and not skip.group(1):
            raise ValueError(f"line {start + 1}: `doc-test: skip` needs a reason")
        blocks.append(Block(lang, start + 1, "\n".join(lines[start + 1 : j]) + "\n", skip.group(1) if skip else None))
        i = j + 1
    return blocks


def prepare_cwd(cwd: Path, checkout: Path) -> None:
    for name in LINKED:
        target = Path(sys.prefix) if name == ".venv" else checkout / name
        if target.exists():
            (cwd / name).symlink_to(target)


def _run_python(block: Block, label: str, scratch: Path) -> None:
    path = scratch / f"doc_block_line{block.line}.py"
    path.write_text(block.code)
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    module.__builtins__ = builtins
    saved_main, saved_argv = sys.modules["__main__"], sys.argv
    sys.modules["__main__"], sys.argv = module, [str(path)]
    try:
        exec(compile(block.code, f"{label}", "exec"), module.__dict__)
    finally:
        sys.modules["__main__"], sys.argv = saved_main, saved_argv
        del module
        gc.collect()  # datasets, runtimes and loaders the block left open are closed now


def main() -> int:
    """Driver: stdin holds {"file", "checkout", "blocks": [{"lang", "line", "code"}]}; runs them in
    order in the current directory; stops at the first failure. Exit 0 when all passed."""
    job = json.load(sys.stdin)
    scratch = Path(tempfile.mkdtemp(prefix="doc-blocks-src-"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for raw in job["blocks"]:
        block = Block(raw["lang"], raw["line"], raw["code"], None)
        label = f"{job['file']}:{block.line}"
        print(f"--- running {label} ({block.kind})", flush=True)
        if block.kind == "python":
            try:
                _run_python(block, label, scratch)
            except BaseException:
                traceback.print_exc(file=sys.stdout)
                print(f"--- FAILED {label}", flush=True)
                return 1
        else:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], env=env, check=False)
            if done.returncode != 0:
                print(f"--- FAILED {label}: exit {done.returncode}", flush=True)
                return 1
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
