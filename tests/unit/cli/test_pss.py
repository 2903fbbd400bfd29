"""`datasetrt pss` (datasetrt/cli/pss.py; scripts/pss is a wrapper): process-tree PSS/USS/RSS
sampling of a command or a pid (docs/memory-guide.md).

The measured programs are small Python scripts that allocate a known number of touched bytes;
PSS of a process is at least its private allocation, so tree totals must be at least the sum.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PSS = ROOT / "scripts" / "pss"
CLI = [sys.executable, "-m", "datasetrt.cli", "pss"]  # what `datasetrt pss` runs
MIB = 2**20
PARENT_ALLOC = 48 * MIB
CHILD_ALLOC = 24 * MIB

CHILD = """
import sys, time
data = b"\\x02" * int(sys.argv[1])   # touched: every page is resident and private
time.sleep(0.8)
"""

PARENT = """
import os, subprocess, sys, time
def mark(label):
    with open(os.environ["PSS_MARK_FILE"], "a") as f:
        f.write(f"{label} {time.time()}\\n")
data = b"\\x01" * int(sys.argv[3])
mark("steady-start")
child = subprocess.Popen([sys.executable, sys.argv[4], sys.argv[5]])
with open(sys.argv[1], "w") as f:
    f.write(str(child.pid))
child.wait()
mark("steady-end")
sys.exit(int(sys.argv[2]))
"""


def run_pss(*args: str, timeout: float = 60, tool: list[str] = CLI) -> subprocess.CompletedProcess:
    return subprocess.run([*tool, *args], capture_output=True, text=True, timeout=timeout)


def test_command_tree_totals_child_csv_and_exit_code(tmp_path):
    parent, child = tmp_path / "parent.py", tmp_path / "child.py"
    parent.write_text(PARENT)
    child.write_text(CHILD)
    pid_file, csv_file, json_file = tmp_path / "child.pid", tmp_path / "samples.csv", tmp_path / "summary.json"
    out = run_pss(
        "--interval",
        "0.05",
        "--csv",
        str(csv_file),
        "--json",
        str(json_file),
        "--",
        sys.executable,
        str(parent),
        str(pid_file),
        "7",
        str(PARENT_ALLOC),
        str(child),
        str(CHILD_ALLOC),
    )
    assert out.returncode == 7, out.stderr  # the command's exit code
    child_pid = int(pid_file.read_text())
    summary = json.loads(json_file.read_text())
    total = summary["total"]
    assert total["peak_pss"] >= PARENT_ALLOC + CHILD_ALLOC
    # steady: median of the last half of the samples between the marks (the child's lifetime)
    assert set(summary["marks"]) == {"steady-start", "steady-end"}
    assert total["steady_pss"] >= PARENT_ALLOC + CHILD_ALLOC
    assert total["steady_uss"] >= PARENT_ALLOC + CHILD_ALLOC
    assert total["peak_rss"] >= total["peak_pss"] >= total["peak_uss"]
    procs = {p["pid"]: p for p in summary["processes"]}
    assert child_pid in procs, "the grandchild of pss (the command's child) was not sampled"
    assert procs[child_pid]["peak_pss"] >= CHILD_ALLOC
    assert procs[child_pid]["ppid"] == summary["pid"]
    assert summary["processes"][0]["pid"] == summary["pid"]
    assert summary["processes"][0]["peak_pss"] >= PARENT_ALLOC
    assert summary["exit_code"] == 7
    # the report: one line per process and a total line
    assert str(child_pid) in out.stderr and "total" in out.stderr and "exited with code 7" in out.stderr

    with open(csv_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "t_s",
        "unix_time",
        "pid",
        "ppid",
        "name",
        "pss_bytes",
        "uss_bytes",
        "rss_bytes",
        "shared_bytes",
    ]
    assert {r["pid"] for r in rows} >= {str(summary["pid"]), str(child_pid), "total"}
    for r in rows:
        assert int(r["shared_bytes"]) == int(r["rss_bytes"]) - int(r["uss_bytes"])
    by_time: dict[str, list[dict]] = {}
    for r in rows:
        by_time.setdefault(r["t_s"], []).append(r)
    assert len(by_time) == total["samples"]
    for group in by_time.values():  # each sample ends with its total row, the sum of its processes
        *procs_rows, tot = group
        assert tot["pid"] == "total"
        assert int(tot["pss_bytes"]) == sum(int(r["pss_bytes"]) for r in procs_rows)
    assert max(int(g[-1]["pss_bytes"]) for g in by_time.values()) == total["peak_pss"]


def test_signal_death_exit_code_and_start_failure(tmp_path):
    out = run_pss("--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert out.returncode == 128 + 15
    out = run_pss("--", str(tmp_path / "no-such-program"))
    assert out.returncode == 127 and "cannot run" in out.stderr


def test_attach_to_pid_with_duration():
    target = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; d = b'x' * {PARENT_ALLOC}; print('ok', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert target.stdout.readline().strip() == "ok"
        start = time.monotonic()
        out = run_pss("--pid", str(target.pid), "--duration", "0.5", "--interval", "0.05")
        assert time.monotonic() - start < 20
        assert out.returncode == 0, out.stderr
        assert target.poll() is None, "attaching must not stop the process"
        assert "stopped by --duration" in out.stderr and str(target.pid) in out.stderr
    finally:
        target.kill()
        target.wait()


def test_duration_ends_a_command_and_usage_errors(tmp_path):
    json_file = tmp_path / "s.json"
    out = run_pss(
        "--duration", "0.3", "--json", str(json_file), "--", sys.executable, "-c", "import time; time.sleep(30)"
    )
    assert out.returncode == 128 + 15  # SIGTERM, like timeout(1)
    assert json.loads(json_file.read_text())["timed_out"] is True
    assert run_pss().returncode == 2  # neither --pid nor a command
    assert run_pss("--pid", "1", "--", "true").returncode == 2


def test_png_needs_matplotlib(tmp_path):
    png = tmp_path / "pss.png"
    out = run_pss("--png", str(png), "--interval", "0.05", "--", sys.executable, "-c", "import time; time.sleep(0.3)")
    if importlib.util.find_spec("matplotlib") is None:
        assert out.returncode == 2
        assert "matplotlib" in out.stderr and not png.exists()
    else:
        assert out.returncode == 0, out.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_exits_2_naming_the_bench_extra(tmp_path):
    """matplotlib is optional (the bench extra): where it is missing, --png is a usage error."""
    png = tmp_path / "pss.png"
    hide = "import sys; sys.modules['matplotlib'] = None; from datasetrt.cli import main; sys.exit(main(sys.argv[1:]))"
    out = run_pss("--png", str(png), "--", sys.executable, "-c", "pass", tool=[sys.executable, "-c", hide, "pss"])
    assert out.returncode == 2 and not png.exists()
    assert "--png needs matplotlib" in out.stderr and 'pip install "datasetrt[bench]"' in out.stderr, out.stderr


def test_scripts_pss_is_the_same_tool(tmp_path):
    """The checkout's scripts/pss runs datasetrt/cli/pss.py: same report, JSON and exit code."""
    json_file = tmp_path / "s.json"
    out = run_pss(
        "--interval",
        "0.05",
        "--json",
        str(json_file),
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
        tool=[sys.executable, str(PSS)],
    )
    assert out.returncode == 3, out.stderr
    assert out.stderr.startswith("scripts/pss: ") and "exited with code 3" in out.stderr
    assert json.loads(json_file.read_text())["exit_code"] == 3
