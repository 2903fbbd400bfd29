"""What the suite's modules (benchmarks.run and the sections it composes) agree on, defined once:
the contender labels every row carries, the read parameters (seed, batch, prefetch), the typed
workload's record shape, and the child process each contender and task runs in.

Boundary: constants and one process launcher; imports no library under test and no other suite
module, so any of them (benchmarks.targets included, which stays pure) can import it.
"""

from __future__ import annotations

import json

from benchmarks.common import DATASET_RT, child_process, new_result

SEED = 11  # every generated workload and every reader config
BATCH = 256  # samples per batch: the batch path, the p95 latency, loaderx steps
PREFETCH = 1024  # ReaderConfig(prefetch_size=...) of every datasetrt / dataset-rt reader

# read contenders on the cache itself
OURS = "datasetrt"
BATCHES = "datasetrt batches"
TO_NUMPY = "datasetrt batches .to_numpy()"
INPROC = "datasetrt in-process"
BATCHES_INPROC = "datasetrt batches in-process"
OURS_ALL = (OURS, BATCHES, TO_NUMPY, INPROC, BATCHES_INPROC)
RT = DATASET_RT
# peers and physical limits over the same payloads (benchmarks.peers, benchmarks.stream_peers)
LOADERX = "loaderx"
TORCH_MEMMAP = "torch DataLoader (memmap)"
MEMMAP_COPY = "memmap copy (limit)"
PREAD = "pread per record (limit)"
GATHER = "numpy memmap gather (limit)"
STREAMING = "MosaicML Streaming"
LITDATA = "LitData"
ORDER_FOLLOWERS = {*OURS_ALL, RT}  # same plan, same order
OWN_ORDER = {STREAMING, LITDATA}  # their own shuffle: checked against the written records' multiset
# torch end to end (benchmarks.torch_batches)
TTD = "datasetrt to_torch_dataloader"
TTB = "datasetrt to_torch_batches"
TTBR = "datasetrt to_torch_batches, reader workers"

TOKENS512 = "int32[512]"  # the typed workload's name
ROW = {"dtype": "<i4", "shape": [512]}  # its records, read as [BATCH, 512] int32 arrays


def contender_child(spec: dict, timeout: float) -> dict:
    """One suite task (`spec["task"]`: read, write, open or build) in a fresh
    `python -m benchmarks.run --child SPEC` process; its figure dict. A datasetrt contender that
    fails raises (the run is broken); a peer's failure or any timeout becomes the row's `error`."""
    child = child_process(["-m", "benchmarks.run", "--child", json.dumps(spec)], timeout_s=timeout)
    if child.timed_out:
        return {**new_result(), "error": f"timed out after {timeout:.0f} s", "peak_pss_mib": None}
    if child.returncode != 0 or child.figures is None:
        if spec["contender"] in OURS_ALL:
            raise RuntimeError(f"{spec['contender']} failed:\n{child.stderr[-3000:]}")
        return {**new_result(), "error": f"exit {child.returncode}: {child.tail(1, 10**6)}", "peak_pss_mib": None}
    return child.figures
