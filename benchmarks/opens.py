"""The suite's open section: one dataset over N small caches (hard links of one 8-record cache,
distinct manifests), then len(); datasetrt `CachedDataset(paths, runtime=None)` against dataset-rt
`DatasetRuntime(num_workers=1).cached_dataset`, each N and contender in a fresh child. A row
counts only when the length is 8 N.

Boundary: the parent side (`bench_open`) launches children and checks lengths; the child side
(`run_open`) imports only its contender's library.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from benchmarks.caches import make_many_caches, open_caches, rt_lib
from benchmarks.common import median, new_result
from benchmarks.suite import OURS, RT, contender_child

OPEN_COUNTS = {"smoke": (1, 10), "quick": (1, 100, 1000), "full": (1, 100, 10_000)}  # caches per open


def run_open(spec: dict) -> dict:
    """Open one dataset over the first `n` of the many small caches, `repeats` times (open_caches:
    datasetrt `CachedDataset(paths, runtime=None)`, dataset-rt `DatasetRuntime(num_workers=1)
    .cached_dataset(paths)`, runtime created beforehand, plus len()). "first_s" is repeat 0, the
    first open in this fresh process (after the API's own imports); it is timed into "seconds" only
    when it is the only repeat."""
    result = {**new_result(), "seconds": [], "first_s": None}
    contender, repeats = spec["contender"], spec["repeats"]
    lib = rt_lib(contender)
    paths = sorted(Path(spec["many"]).iterdir())[: spec["n"]]
    runtime = None if contender == OURS else lib.DatasetRuntime(num_workers=1)
    lib.ReaderConfig(seed=1), lib.CachedDataset  # resolve the API (datasetrt imports it lazily) before timing
    for rep in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result["count"] = open_caches(lib, runtime, paths)
        dt = time.perf_counter() - t0
        if rep == 0:
            result["first_s"] = dt
        if rep > 0 or repeats == 1:
            result["seconds"].append(dt)
    return result


def bench_open(workdir: Path, counts: tuple[int, ...], repeats: int, failures: list[str]) -> list[dict]:
    """Open time of a dataset over N small caches (make_many_caches: hard links of one 8-record
    cache under distinct manifests) for each N; each contender and N in a fresh subprocess."""
    paths = make_many_caches(workdir, max(counts))
    rows = []
    for n in counts:
        for contender in (OURS, RT):
            r = contender_child(
                {"task": "open", "contender": contender, "many": str(paths[0].parent), "n": n, "repeats": repeats},
                timeout=600,
            )
            expected = 8 * n
            if r.get("error"):
                r["check"] = "not compared"
            elif r["count"] == expected:
                r["check"] = f"same length ({expected:,} samples)"
            else:
                r["check"] = f"DIFFERENT LENGTH ({r['count']:,}, expected {expected:,})"
                failures.append(f"open {n} caches: {contender} len {r['count']} vs {expected}")
            rows.append(
                {
                    "workload": f"{n:,} caches",
                    "caches": n,
                    "contender": contender,
                    **{k: v for k, v in r.items() if k != "traceback"},
                }
            )
            if r.get("error"):
                print(f"open {n:>6,} caches {contender:27} ERROR {r['error']}", flush=True)
            else:
                print(
                    f"open {n:>6,} caches {contender:27} {median(r['seconds']) * 1e3:>9.2f} ms  first {r['first_s'] * 1e3:9.2f} ms"
                    f"  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                    flush=True,
                )
    return rows
