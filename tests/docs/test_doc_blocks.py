"""Every ```python and ```bash block of README.md and docs/*.md runs as pasted (tests/docs/blocks.py
says how; a block that must not run in tests carries `<!-- doc-test: skip REASON -->` above it).
One subprocess per file runs its blocks in order in a temporary directory. A page about object
storage (S3_PAGES) runs against a real S3 server started for it (moto's, tests/servers/moto.py)
with an empty bucket `my-bucket`, reached through the standard AWS_* variables the page tells its
reader to set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import parse, prepare_cwd

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 600
S3_PAGES = {"docs/object-storage.md"}
S3_BUCKET = "my-bucket"


def run_file(text: str, label: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the runnable, unskipped blocks of a Markdown `text` in `cwd` through the driver."""
    blocks = [{"lang": b.lang, "line": b.line, "code": b.code} for b in parse(text) if b.kind and b.skip is None]
    job = json.dumps({"file": label, "checkout": str(ROOT), "blocks": blocks})
    prepare_cwd(cwd, ROOT)
    return subprocess.run(
        [sys.executable, "-m", "tests.docs.blocks"],
        input=job,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**_env(), **(env or {})},
        timeout=TIMEOUT_S,
        check=False,
    )


def _env() -> dict:
    import os

    # the driver module is imported from the checkout; blocks see the temporary cwd
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_doc_blocks_run_as_pasted(doc, tmp_path):
    label = str(doc.relative_to(ROOT))
    blocks = parse(doc.read_text())
    if not any(b.kind and b.skip is None for b in blocks):
        pytest.skip(f"{label} has no runnable block")
    if label in S3_PAGES:
        from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, REGION, MotoServer

        with MotoServer() as server:
            server.create_bucket(S3_BUCKET)
            env = {
                "AWS_ENDPOINT_URL": server.endpoint,
                "AWS_ALLOW_HTTP": "true",
                "AWS_REGION": REGION,
                "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
                "AWS_EC2_METADATA_DISABLED": "true",
            }
            env["DATASETRT_CACHE_DIR"] = str(tmp_path / "node-cache")  # never the home directory
            out = run_file(doc.read_text(), label, tmp_path, env)
    else:
        out = run_file(doc.read_text(), label, tmp_path)
    assert out.returncode == 0, f"{label}: a block failed\n{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
    ran = [line for line in out.stdout.splitlines() if line.startswith("--- running ")]
    assert len(ran) == sum(1 for b in blocks if b.kind and b.skip is None)


def test_skips_have_reasons_and_fences_close():
    for doc in DOCS:
        for block in parse(doc.read_text()):  # raises on a reasonless skip or an unclosed fence
            assert block.skip is None or len(block.skip) >= 8, f"{doc}:{block.line}: say why it is skipped"


SAMPLE = """# t

```python
x = 1
```

<!-- doc-test: skip needs a GPU -->
```python
raise SystemExit("must not run")
```

```bash
echo ok > out.txt
```

```
plain text, not run
```

```python
import pathlib
assert pathlib.Path("out.txt").read_text() == "ok\\n"
print(x)
```
"""


def test_the_runner_runs_in_order_skips_what_is_marked_and_reports_the_failing_block(tmp_path):
    blocks = parse(SAMPLE)
    assert [(b.kind, b.line, b.skip) for b in blocks] == [
        ("python", 3, None),
        ("python", 8, "needs a GPU"),
        ("bash", 12, None),
        (None, 16, None),
        ("python", 20, None),
    ]
    out = run_file(SAMPLE, "sample.md", tmp_path)
    # the last block sees the bash block's file (same cwd) but not the first block's `x` (own namespace)
    assert out.returncode == 1
    assert "--- FAILED sample.md:20" in out.stdout and "NameError: name 'x' is not defined" in out.stdout
    assert "must not run" not in out.stdout
