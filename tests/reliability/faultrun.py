"""Fault-injected operations in a subprocess: `run_faulted` (test side) starts
`python -m tests.reliability.faultrun REQUEST` with the shim preloaded (tests/reliability/faultshim.c,
its rules in FAULTSHIM_RULES); the child arms the shim around one operation only (not the
interpreter's start-up, not its own accounting) and prints what happened as one JSON line.

Operations (REQUEST is JSON: {"op": ..., ...}):
- "write": write_cache of `sources` ([name, n_items], ...) into `base` with 2 threads;
- "read": read every sample of `paths` (ordered), in worker processes unless `parallel` is false
  (also reports the size of the /dev/shm it ran with, and the rings mapped after the read);
- "ring": `runtime.shm.create_shared_memory("ring", size)` directly.
Every outcome reports the results (or the exception: class, builtin bases, message, errno) and
the descriptors the operation leaked or closed that were not its own (by number and target).
Without the shim preloaded the child runs the operation unfaulted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_DEADLINE_S = 300.0  # generous: each run takes about a second; this only catches a hang


def run_faulted(shim: Path, rules: str, log: Path, op: str, **request) -> dict:
    """Run `op` in a child with the shim preloaded and `rules`; its outcome, plus "faults": the
    lines of the shim's log (one per injected failure)."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(shim), env.get("LD_PRELOAD")]))
    env["FAULTSHIM_RULES"], env["FAULTSHIM_LOG"] = rules, str(log)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("FAULTSHIM_ARMED", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reliability.faultrun", json.dumps({"op": op, **request})],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
    )
    assert proc.returncode == 0, f"the faulted child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    outcome["faults"] = log.read_text().splitlines() if log.exists() else []
    return outcome


# -- the child -------------------------------------------------------------------------------------


def _descriptors() -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if not target.startswith("/proc/"):
            out[int(entry)] = target
    return out


def _error(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "bases": [c.__name__ for c in type(exc).__mro__],
        "message": str(exc),
        "errno": getattr(exc, "errno", None),
    }


def _write(request: dict) -> dict:
    import datasetrt as drt
    from tests.conftest import ListSource, sample_items, writer_config

    sources = [ListSource(name, sample_items(n, tag=name)) for name, n in request["sources"]]
    with drt.DatasetRuntime(num_workers=2) as rt:
        results = _armed(lambda: rt.write_cache(sources, request["base"], writer_config=writer_config()))
    if isinstance(results, dict):
        return results
    return {
        "results": [
            {
                "type": type(r).__name__,
                "name": r.source_name,
                "path": str(r.path) if isinstance(r, drt.CacheWriteSuccess) else None,
                "message": getattr(r, "message", None),
                "durable": getattr(r, "durable", None),
            }
            for r in results
        ]
    }


def _read(request: dict) -> dict:
    import datasetrt as drt

    config = drt.ReaderConfig(seed=0, shuffle=False, worker_timeout_s=60.0)
    with drt.DatasetRuntime(num_workers=2, parallel_reads=request.get("parallel", True)) as rt:
        ds = rt.cached_dataset(request["paths"], reader_config=config)
        try:
            samples = _armed(lambda: [s.sample_id for s in ds])
        finally:
            ds.close()
        maps = Path("/proc/self/maps").read_text().split()
        rings = sorted({word for word in maps if word.startswith("/memfd:datasetrt-")})  # the runtime's idle ring
    shm = os.statvfs("/dev/shm")
    outcome = samples if isinstance(samples, dict) else {"samples": samples}
    return {**outcome, "dev_shm_bytes": shm.f_blocks * shm.f_frsize, "rings": rings}


def _ring(request: dict) -> dict:
    from datasetrt.runtime.shm import create_shared_memory

    made = _armed(lambda: create_shared_memory("ring", request["size"]))
    if isinstance(made, dict):
        return made
    mapping, fd = made
    mapping.close()
    os.close(fd)
    return {"created": True}


OPS = {"write": _write, "read": _read, "ring": _ring}
_STATE: dict = {}


def _armed(operation):
    """Run `operation` with the shim armed; its value, or the error it raised (a dict). Records
    the descriptors that changed across it."""
    import ctypes

    arm = getattr(ctypes.CDLL(None), "faultshim_arm", lambda on: 0)  # no shim: nothing to arm
    before = _descriptors()
    arm(1)
    try:
        value = operation()
    except BaseException as exc:
        value = {"error": _error(exc)}
    finally:
        arm(0)
    after = _descriptors()
    _STATE["leaked"] = sorted(f"{fd} {path}" for fd, path in after.items() if before.get(fd) != path)
    _STATE["lost"] = sorted(f"{fd} {path}" for fd, path in before.items() if after.get(fd) != path)
    return value


def main() -> None:
    os.environ.pop("LD_PRELOAD", None)  # processes this one starts run without the shim
    request = json.loads(sys.argv[1])
    outcome = OPS[request["op"]](request)
    outcome.update(_STATE)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
