"""MosaicML Streaming and LitData as benchmark contenders: building their local stores from the
suite's flat payload file, and reading them back through their documented torch loaders.

Boundary: knows the suite's flat file (benchmarks.workloads: `payloads.bin` + `offsets.npy`) and the
child figure dict, never datasetrt. Both libraries are optional (the `bench` extra); a missing one
is reported as the row's error, never raised.

Stores (built once per workload and codec, in a child process, before any timing):
- Streaming: an MDS directory written with `streaming.MDSWriter` (one shard per 64 MiB); column
  `data` of encoding `bytes`, or for a typed workload `ndarray:<dtype>:<n>` (one fixed-shape array
  per record); `compression="zstd"` for zstd rows.
- LitData: an optimized directory written with `litdata.optimize` (one worker, fork, 64 MB
  chunks); items `{"data": bytes}` or `{"data": numpy array}` for a typed workload;
  `compression="zstd"` for zstd rows.
Write order is the flat file's order; a row's bytes are the record's payload bytes (a typed row
is the little-endian int32 array, the same bytes).

Reading: `torch.utils.data.DataLoader(streaming.StreamingDataset(local=..., batch_size=256,
shuffle=...), batch_size=256, num_workers=W)` and `litdata.StreamingDataLoader(
litdata.StreamingDataset(dir, shuffle=...), batch_size=256, num_workers=W)` (fork workers unless
a start method is given), both with `persistent_workers=True` as datasetrt's loaders default (a
later pass measures reading, not a worker restart; the first batch still includes start-up). Neither can replay datasetrt's shuffled plan (both are iterable datasets with their own
shuffle), so their shuffled rows are their own permutation of all records and are checked against
the multiset of the written records; their unshuffled order is their own partition of the
records across workers, checked as a multiset too.

MosaicML Streaming 0.13 and torchvision: `streaming/__init__.py` imports `streaming.vision`, whose
`base.py` imports torchvision at module level; the torchvision wheel pip installs beside the CPU
torch 2.13.0 wheel fails on import (`RuntimeError: operator torchvision::nms does not exist`), and
without torchvision the same line raises ModuleNotFoundError, so `import streaming` cannot work
here either way. `import_streaming()` therefore registers `streaming` in `sys.modules` as a bare
package module (its real `__path__` and spec, its `__init__.py` not executed) and imports
`streaming.base`, which holds MDSWriter and StreamingDataset and never imports torchvision. No
module is faked and the library is untouched: only the package's eager imports of its vision /
text / multimodal convenience subpackages are skipped. A spawned DataLoader worker unpickles the
dataset, which imports `streaming.base.dataset`; the benchmark modules that read Streaming call
`install_streaming_package()` at import, so the spawned worker (which imports the parent's main
module first) has the bare package too.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import traceback
import types
from pathlib import Path

import numpy as np

from benchmarks.common import new_result
from benchmarks.peers import batch_passes, count_rows, load_flat
from benchmarks.suite import BATCH, LITDATA, STREAMING

SHARD_BYTES = 1 << 26  # 64 MiB shards / chunks on both sides
INSTALL_HINT = "the bench extra: pip install mosaicml-streaming litdata torch==2.13.0"


def installed(contender: str) -> bool:
    """Whether the contender's library is importable in this environment (no import done)."""
    return importlib.util.find_spec("streaming" if contender == STREAMING else "litdata") is not None


def install_streaming_package() -> bool:
    """Register `streaming` as a bare package module (see the module docstring) unless it is
    already imported; True when the package is installed. Cheap: imports nothing."""
    if "streaming" in sys.modules:
        return True
    spec = importlib.util.find_spec("streaming")
    if spec is None:
        return False
    pkg = types.ModuleType("streaming")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    pkg.__package__ = "streaming"
    sys.modules["streaming"] = pkg
    return True


def import_streaming():
    """(MDSWriter, StreamingDataset) from `streaming.base`, without running `streaming/__init__.py`."""
    install_streaming_package()
    from streaming.base import MDSWriter, StreamingDataset

    return MDSWriter, StreamingDataset


def import_library(contender: str) -> None:
    """Import the contender's library (and torch) now, so that timing starts after the imports."""
    if contender == STREAMING:
        import_streaming()
    else:
        import litdata  # noqa: F401


# ---------------------------------------------------------------------------- stores


def _records(flat: str):
    """The flat file's payloads in write order as memoryviews of one mapping (no copy)."""
    payloads, offsets = load_flat(flat)
    mm = np.memmap(payloads, dtype=np.uint8, mode="r") if offsets[-1] else np.zeros(0, np.uint8)
    return mm, offsets


def build_mds(out: Path, flat: str, typed: dict | None, codec: str) -> None:
    """An MDS directory of the flat file's records (see the module docstring)."""
    MDSWriter, _ = import_streaming()
    mm, offsets = _records(flat)
    if typed:
        dt = np.dtype(typed["dtype"])
        columns = {"data": f"ndarray:{dt.name}:{','.join(map(str, typed['shape']))}"}
    else:
        columns = {"data": "bytes"}
    with MDSWriter(
        out=str(out),
        columns=columns,
        compression=None if codec == "raw" else "zstd",
        size_limit=SHARD_BYTES,
        progress_bar=False,
    ) as writer:
        for i in range(len(offsets) - 1):
            raw = mm[offsets[i] : offsets[i + 1]]
            value = raw.view(dt).reshape(typed["shape"]) if typed else raw.tobytes()
            writer.write({"data": value})


def litdata_item(item: tuple):
    """litdata.optimize's `fn`: one record of the flat file (path, start, stop, dtype or None,
    shape) as {"data": bytes} or {"data": numpy array}."""
    path, start, stop, dtype, shape = item
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(stop - start)
    return {"data": np.frombuffer(raw, dtype=dtype).reshape(shape).copy() if dtype else raw}


def build_litdata(out: Path, flat: str, typed: dict | None, codec: str) -> None:
    """A LitData optimized directory of the flat file's records (see the module docstring)."""
    import litdata

    payloads, offsets = load_flat(flat)
    dtype, shape = (typed["dtype"], tuple(typed["shape"])) if typed else (None, None)
    items = [(str(payloads), int(offsets[i]), int(offsets[i + 1]), dtype, shape) for i in range(len(offsets) - 1)]
    litdata.optimize(
        fn=litdata_item,
        inputs=items,
        output_dir=str(out),
        chunk_bytes=SHARD_BYTES,
        num_workers=1,
        compression=None if codec == "raw" else "zstd",
        start_method="fork",
        mode="overwrite",
    )


def run_build(spec: dict) -> dict:
    """Child task: build one contender's store; {"path"} or {"error"}."""
    out = Path(spec["out"])
    try:
        builder = build_mds if spec["contender"] == STREAMING else build_litdata
        t0 = time.perf_counter()
        builder(out, spec["flat"], spec.get("typed"), spec["codec"])
        return {"path": str(out), "build_s": time.perf_counter() - t0}
    except Exception as exc:  # a peer API failure is a finding, not a crash
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}


# ---------------------------------------------------------------------------- loaders


def streaming_loader(store: str, shuffle: bool, seed: int, workers: int, method: str | None = None):
    """Streaming's documented torch path: a StreamingDataset (told the batch size) in a DataLoader."""
    from torch.utils.data import DataLoader

    _, StreamingDataset = import_streaming()
    ds = StreamingDataset(local=store, shuffle=shuffle, shuffle_seed=seed, batch_size=BATCH)
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        multiprocessing_context=method if workers else None,
        persistent_workers=workers > 0,
    )


def litdata_loader(store: str, shuffle: bool, seed: int, workers: int, method: str | None = None):
    """LitData's documented torch path: StreamingDataLoader over a StreamingDataset."""
    import litdata

    ds = litdata.StreamingDataset(store, shuffle=shuffle, seed=seed)
    kwargs = {"multiprocessing_context": method} if workers and method else {}
    return litdata.StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0, **kwargs
    )


LOADERS = {STREAMING: streaming_loader, LITDATA: litdata_loader}


def batch_rows(value) -> list | np.ndarray:
    """One loader batch's `data` as rows: a [B, ...] tensor -> a numpy array of B rows; a list of
    bytes / memoryviews -> the list."""
    if hasattr(value, "numpy"):
        arr = value.numpy()
        return arr.reshape(len(arr), -1)
    return list(value)


def run_stream_peer(spec: dict) -> dict:
    """A benchmarks.run read contender: the peer's loader with W workers over its store, `repeats`
    passes (repeat 0 digests and is untimed when there are more)."""
    result = new_result()
    contender = spec["contender"]
    if not spec.get("store"):
        result["error"] = spec.get("store_error") or f"not installed ({INSTALL_HINT})"
        return result
    try:
        import_library(contender)  # imports stay out of "first sample", as for every other contender
        start = time.perf_counter()
        loader = LOADERS[contender](spec["store"], spec["shuffle"], spec["seed"], spec["workers"])
        result["note"] = (
            f"own {'shuffle' if spec['shuffle'] else 'worker partition order'}; "
            f"torch DataLoader workers={spec['workers']} (fork)"
        )
        batch_passes(
            result,
            spec["repeats"],
            start,
            lambda _rep: loader,  # noqa: F821 (called before the del below)
            lambda batch, d: count_rows(batch_rows(batch["data"]), d),
        )
        del loader
    except Exception as exc:  # a peer API failure is a finding, not a crash
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2000:]
    return result
