"""One configuration of the memory benchmark (benchmarks.memory), in its own fresh process: the
plain torch map-style datasets it compares with, and the epoch a configuration reads between its
steady-start and steady-end marks.

Boundary: runs inside the measured process, which the sampler watches from outside
(`scripts/pss`, datasetrt/cli/pss.py), so everything it imports is in the figures: it imports a
library only inside `run_one`, the reader's own (and torch for the torch readers).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.caches import rt_lib

BATCH = 64
SEED = 11
PREFETCH = 1024
MARK_ENV = "PSS_MARK_FILE"  # datasetrt/cli/pss.py's phase-mark file, inherited from the sampler
TORCH_READERS = ("drt-loader", "dataset-rt-loader", "torch-dicts", "torch-numpy")


# --------------------------------------------------------------------------------------------
# plain torch map-style datasets (module level: picklable by reference)


class _Pread:
    """Reads record bytes from the raw payload file; the descriptor is opened per process."""

    def __init__(self, data_path: str) -> None:
        self.data_path = data_path
        self._fd: int | None = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {"data_path": self.data_path, "_fd": None, "_pid": -1}

    def read(self, offset: int, length: int) -> bytes:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.data_path, os.O_RDONLY), os.getpid()
        return os.pread(self._fd, length, offset)


class DictRecords(_Pread):
    """One Python dict per record (the pattern whose refcount writes un-share forked pages)."""

    def __init__(self, data_path: str, offsets: list[int]) -> None:
        super().__init__(data_path)
        self.items = [
            {
                "sample_id": i,
                "offset": offsets[i],
                "length": offsets[i + 1] - offsets[i],
                "metadata": {"benchmark_position": i, "wide": f"w{i % 97:04d}"},
            }
            for i in range(len(offsets) - 1)
        ]

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "items": self.items}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        item = self.items[i]
        return {
            "data": self.read(item["offset"], item["length"]),
            "sample_id": item["sample_id"],
            "metadata": dict(item["metadata"]),
        }


class NumpyRecords(_Pread):
    """The same records with offsets, ids and metadata in numpy arrays (a few objects in all)."""

    def __init__(self, data_path: str, offsets) -> None:
        import numpy as np

        super().__init__(data_path)
        n = len(offsets) - 1
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sample_id = np.arange(n, dtype=np.int64)
        self.position = np.arange(n, dtype=np.int64)
        self.wide = np.array([f"w{i:04d}".encode() for i in range(97)], dtype="S5")[np.arange(n) % 97]

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), **{k: getattr(self, k) for k in ("offsets", "sample_id", "position", "wide")}}

    def __len__(self) -> int:
        return len(self.sample_id)

    def __getitem__(self, i: int) -> dict:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return {
            "data": self.read(lo, hi - lo),
            "sample_id": int(self.sample_id[i]),
            "metadata": {"benchmark_position": int(self.position[i]), "wide": self.wide[i].decode()},
        }


# --------------------------------------------------------------------------------------------
# one configuration, in this (fresh) process


def _mark(label: str) -> None:
    """Append "<label> <unix time>" to the sampler's mark file (when there is one)."""
    path = os.environ.get(MARK_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{label} {time.time():.6f}\n")


def _batch_len(batch) -> int:
    if isinstance(batch, dict):
        return len(batch["sample_id"])
    return len(batch.sample_id)


def run_one(reader: str, workers: int, method: str | None, workdir: Path) -> dict:
    """Read one epoch; returns {"samples", "epoch_s", "imports_torch"}. Marks the epoch."""
    cache = (workdir / "cache-path.txt").read_text().strip()
    result = {"reader": reader, "workers": workers, "method": method}
    if reader in TORCH_READERS:
        import torch

        torch.set_num_threads(1)
    if reader in ("torch-dicts", "torch-numpy"):
        import numpy as np
        from torch.utils.data import DataLoader

        offsets = np.load(workdir / "offsets.npy")
        dataset = (
            DictRecords(str(workdir / "payloads.bin"), offsets.tolist())
            if reader == "torch-dicts"
            else NumpyRecords(str(workdir / "payloads.bin"), offsets)
        )
        del offsets
        _mark("steady-start")
        t0 = time.perf_counter()
        dl = DataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(SEED),
            multiprocessing_context=method if workers else None,
        )
        n = sum(_batch_len(b) for b in dl)
    else:
        lib = rt_lib(reader)
        cfg = lib.ReaderConfig(seed=SEED, shuffle=True, prefetch_size=PREFETCH)
        runtime = None
        if reader == "drt-runtime":
            if workers:
                runtime = lib.DatasetRuntime(num_workers=workers, start_method=method)
                ds = runtime.cached_dataset([cache], reader_config=cfg)
            else:
                ds = lib.CachedDataset([cache], reader_config=cfg, runtime=None)
        elif reader == "drt-loader":
            ds = lib.CachedDataset([cache], reader_config=cfg, runtime=None)
        else:
            runtime = lib.DatasetRuntime(num_workers=workers if reader == "dataset-rt-runtime" else 1)
            ds = runtime.cached_dataset([cache], reader_config=cfg)
        _mark("steady-start")
        t0 = time.perf_counter()
        if reader.endswith("-runtime"):
            n = 0
            for sample in ds:
                n += len(sample.data) > 0
        else:
            kwargs = {"shuffle": True, "seed": SEED, "batch_size": BATCH, "num_workers": workers, "verbose": False}
            if workers:
                kwargs["multiprocessing_context"] = method
            dl = ds.to_torch_dataloader(**kwargs)
            n = sum(_batch_len(b) for b in dl)
    result["epoch_s"] = time.perf_counter() - t0
    _mark("steady-end")
    result["samples"] = n
    result["imports_torch"] = "torch" in sys.modules
    result["imports_pyarrow"] = "pyarrow" in sys.modules
    result["imports_polars"] = "polars" in sys.modules
    return result
