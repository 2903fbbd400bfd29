"""datasetrt/integrations/torch/options.py: the spawn guard check and the quiet `loader_ready` line.

A loader whose workers re-run the user's script (spawn, dataset-rt's default start method, or
forkserver) is refused when built from a top-level statement outside `if __name__ == "__main__":`
(each worker would otherwise build it again while bootstrapping and die); the statement's place is
read from the script's AST (`_guarded`, tested directly here without torch). The end-to-end checks
run user scripts in fresh interpreters, since what matters is the real `__main__`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from datasetrt.integrations.torch.options import _guarded

ROOT = str(Path(__file__).resolve().parents[3])

GUARDED_SOURCE = textwrap.dedent("""
    import os
    x = 1                                   # 3
    if __name__ == "__main__":              # 4
        run()                               # 5
    else:
        other()                             # 7
    try:
        if "__main__" == __name__:          # 9
            with open(os.devnull):
                run()                       # 11
    except OSError:
        if __name__ == "__main__":
            run()                           # 14
    def f():
        run()                               # 16
    if __name__ != "__main__":
        run()                               # 18
    for _ in range(1):
        run()                               # 20
""")


@pytest.mark.parametrize(
    "line, guarded",
    [(3, False), (5, True), (7, False), (11, True), (14, True), (16, False), (18, False), (20, False)],
)
def test_a_line_is_guarded_only_inside_a_main_test_body(line, guarded):
    assert _guarded(ast.parse(GUARDED_SOURCE).body, line) is guarded


# A user script; argv: cache base dir. {GUARD} is replaced by the test: a guard or nothing.
SCRIPT = """\
import logging
import sys

import numpy as np

import datasetrt as drt
from datasetrt.sources import NumpySource


def build(context):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(
            [NumpySource("n", np.arange(64, dtype=np.int32).reshape(16, 4), index_column="i")],
            sys.argv[1],
            writer_config=drt.WriterConfig(show_progress=False),
            if_exists="skip_identical",
        )
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    if context is None:  # dataset-rt's defaults: spawn, verbose=True
        return ds.to_torch_dataloader(batch_size=4, num_workers=1, shuffle=False, collate_fn=len)
    return ds.to_torch_dataloader(
        batch_size=4, num_workers=1, shuffle=False, collate_fn=len, multiprocessing_context=context
    )


if sys.argv[2] == "log":
    logging.basicConfig(level=logging.INFO)
{GUARD}print("samples", sum(build(None if sys.argv[3] == "default" else sys.argv[3])))
"""


def run_script(tmp_path: Path, guard: bool, context: str, log: str = "quiet") -> subprocess.CompletedProcess:
    code = SCRIPT.replace("{GUARD}", 'if __name__ == "__main__":\n    ' if guard else "")
    script = tmp_path / ("guarded.py" if guard else "unguarded.py")
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "caches"), log, context],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_unguarded_script_with_spawned_workers_is_refused_in_one_line(tmp_path):
    out = run_script(tmp_path, guard=False, context="default")
    assert out.returncode == 1 and "samples" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    line = next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if text.startswith("{GUARD}print"))
    assert last == (
        f"datasetrt.errors.LoaderStateError: multiprocessing_context='spawn' starts DataLoader workers that "
        f"re-run {tmp_path / 'unguarded.py'}, and its line {line}, which is running to_torch_dataloader, is not under "
        '`if __name__ == "__main__":`; put the code that builds and iterates the loader under that guard, or '
        "pass multiprocessing_context='fork' (or num_workers=0)"
    )
    assert "exited unexpectedly" not in out.stderr  # refused before any worker started
    forkserver = run_script(tmp_path, guard=False, context="forkserver")
    assert "multiprocessing_context='forkserver' starts DataLoader workers" in forkserver.stderr


def test_guarded_scripts_and_fork_run_and_the_ready_line_is_quiet_by_default(tmp_path):
    guarded = run_script(tmp_path, guard=True, context="default")
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.splitlines() == ["samples 16"] and "loader_ready" not in guarded.stderr
    forked = run_script(tmp_path, guard=False, context="fork")  # fork re-runs nothing
    assert forked.returncode == 0 and forked.stdout.splitlines() == ["samples 16"], forked.stderr
    logged = run_script(tmp_path, guard=False, context="fork", log="log")  # logging configured: shown
    assert logged.returncode == 0, logged.stderr
    assert "INFO:datasetrt.loader:event=loader_ready" in logged.stderr
