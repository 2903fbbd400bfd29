"""The suite's peer read contenders: loaderx, a torch DataLoader over numpy memmap files, and the
physical limits (memmap copy of the same bytes from the page cache, raw pread loop per record,
numpy memmap gather of typed rows).

Every workload also exists as a flat file of the same payloads: `payloads.bin` (payloads
concatenated in write order) and `offsets.npy` (int64, N+1 byte offsets). The torch contender and
the limits read those (uncompressed) bytes; loaderx reads its own store built from the same payloads.

Each `run_*` function runs inside a fresh contender subprocess and returns the same figure dict as
the datasetrt contenders (benchmarks.cache_reads): rates, mib, p95_batch_ms, first_sample_s,
digest (ordered), multiset, count, plus `note` / `error` text. A failing peer API call is
reported as `error`, never raised, so one peer cannot crash the suite.

Boundary: never imports datasetrt; reads the flat file, the plan's .npy and loaderx stores only.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks.common import Digest, new_result, record_rep
from benchmarks.suite import BATCH, LOADERX, MEMMAP_COPY, PREAD, TORCH_MEMMAP


def load_flat(flat: str) -> tuple[Path, np.ndarray]:
    path = Path(flat)
    return path / "payloads.bin", np.load(path / "offsets.npy")


def plan(spec: dict, count: int) -> np.ndarray:
    """Read order: datasetrt's own sample order for this run (`spec["order"]`, an .npy of sample ids
    that benchmarks.workloads records from datasetrt itself), else write order."""
    return np.load(spec["order"]) if spec.get("order") else np.arange(count)


def batch_passes(result: dict, repeats: int, start: float, batches, count) -> None:
    """`repeats` passes over a peer's batches into `result` (record_rep): `batches(rep)` returns
    one pass's iterable of batches (called before the pass's clock starts), `count(batch, d)`
    returns (records, bytes) of one batch and feeds each record to digest `d` when given. Repeat 0
    computes the digests and sets first_sample_s (from `start`)."""
    for rep in range(repeats):
        d = Digest() if rep == 0 else None
        n = nbytes = 0
        stamps: list[float] = []
        it = batches(rep)
        t0 = time.perf_counter()
        for batch in it:
            if rep == 0 and n == 0:
                result["first_sample_s"] = time.perf_counter() - start
            n_rows, n_bytes = count(batch, d)
            n += n_rows
            nbytes += n_bytes
            stamps.append(time.perf_counter())
        dt = time.perf_counter() - t0
        if d is not None:
            result.update(d.result())
        record_rep(result, rep, repeats, n, nbytes, dt, t0, stamps)


class PlanSampler:
    """loaderx sampler protocol (`next()` -> uint64 indices) replaying a fixed plan in batches."""

    def __init__(self, order: np.ndarray, batch: int) -> None:
        self.order = np.ascontiguousarray(order, dtype=np.uint64)
        self.batch = batch
        self.step = 0

    def next(self) -> np.ndarray:
        s = (self.step * self.batch) % len(self.order)
        self.step += 1
        return self.order[s : s + self.batch]


# ---------------------------------------------------------------------------- physical limits


def run_memmap_copy(spec: dict) -> dict:
    """One numpy copy of the whole memmapped payload file per repeat (page cache -> private memory)."""
    result = new_result()
    if spec["shuffle"]:
        result["error"] = "no shuffle (one sequential copy)"
        return result
    payloads, offsets = load_flat(spec["flat"])
    n = len(offsets) - 1
    mm = np.memmap(payloads, dtype=np.uint8, mode="r")
    start = time.perf_counter()
    for rep in range(spec["repeats"]):
        t0 = time.perf_counter()
        out = np.array(mm, copy=True)
        dt = time.perf_counter() - t0
        if rep == 0:
            result["first_sample_s"] = time.perf_counter() - start
            d = Digest()
            for i in range(n):
                d.add(out[offsets[i] : offsets[i + 1]])
            result.update(d.result())
        record_rep(result, rep, spec["repeats"], n, out.nbytes, dt, t0, [])
        del out
    return result


def run_pread_loop(spec: dict) -> dict:
    """os.pread of each record's bytes, in datasetrt's order, from the flat payload file."""
    result = new_result()
    payloads, offsets = load_flat(spec["flat"])
    n = len(offsets) - 1
    order = plan(spec, n)
    starts = offsets[:-1].tolist()
    sizes = np.diff(offsets).tolist()
    order_l = order.tolist()
    fd = os.open(payloads, os.O_RDONLY)
    pread = os.pread
    try:
        start = time.perf_counter()
        for rep in range(spec["repeats"]):
            d = Digest() if rep == 0 else None
            nbytes = 0
            stamps = []
            t0 = time.perf_counter()
            for k, i in enumerate(order_l):
                b = pread(fd, sizes[i], starts[i])
                nbytes += len(b)
                if d is not None:
                    if k == 0:
                        result["first_sample_s"] = time.perf_counter() - start
                    d.add(b)
                if (k + 1) % BATCH == 0:
                    stamps.append(time.perf_counter())
            dt = time.perf_counter() - t0
            if d is not None:
                result.update(d.result())
            record_rep(result, rep, spec["repeats"], n, nbytes, dt, t0, stamps)
    finally:
        os.close(fd)
    return result


def run_memmap_gather(spec: dict) -> dict:
    """The physical reference for fixed-shape typed records: a numpy memmap of the flat file as
    [N, *row_shape] `dtype`, gathered with one fancy index per batch of 256 in datasetrt's order
    (`mm[order[s:s + 256]]`, a new [256, *row_shape] array per batch)."""
    result = new_result()
    payloads, offsets = load_flat(spec["flat"])
    n = len(offsets) - 1
    mm = np.memmap(payloads, dtype=np.dtype(spec["dtype"]), mode="r").reshape(n, *spec["row_shape"])
    order = plan(spec, n)
    batch_passes(
        result,
        spec["repeats"],
        time.perf_counter(),
        lambda _rep: (mm[order[s : s + BATCH]] for s in range(0, n, BATCH)),
        count_rows,
    )
    return result


# ---------------------------------------------------------------------------- torch DataLoader


class MemmapDataset:
    """Map-style dataset over the flat payload file; the memmap is opened lazily in each worker."""

    def __init__(self, flat: str, fixed: bool) -> None:
        self.payloads, self.offsets = load_flat(flat)
        self.fixed = fixed
        self.mm = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int):
        if self.mm is None:
            self.mm = np.memmap(self.payloads, dtype=np.uint8, mode="r")
        return np.array(self.mm[self.offsets[i] : self.offsets[i + 1]])  # copy out of the page cache


def collate_list(batch):
    return batch


def run_torch(spec: dict) -> dict:
    """torch.utils.data.DataLoader(batch_size=256, num_workers=W, sampler=plan) over MemmapDataset. Fixed-size
    records use the default collate (one stacked uint8 tensor per batch); variable ones a list."""
    from torch.utils.data import DataLoader

    result = new_result()
    fixed = spec["fixed"]
    start = time.perf_counter()
    ds = MemmapDataset(spec["flat"], fixed)
    n = len(ds)
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=plan(spec, n).tolist(),
        num_workers=spec["workers"],
        collate_fn=None if fixed else collate_list,
        persistent_workers=spec["workers"] > 0,
    )
    batch_passes(
        result,
        spec["repeats"],
        start,
        lambda _rep: loader,  # noqa: F821 (called before the del below)
        lambda batch, d: count_rows(batch.numpy() if fixed else batch, d),
    )
    del loader
    return result


# ---------------------------------------------------------------------------- loaderx


def build_loaderx(store: Path, payloads: list, fixed_size: int | None, dtype: str, codec: str) -> None:
    """Store the same payloads in a loaderx Dense (fixed-size) or Ragged (variable) store."""
    from loaderx.zrecord import Dense, Ragged, RaggedBatch

    dt = np.dtype(dtype)
    chunk = 4096
    if fixed_size is not None:
        with Dense.create(store, dt, (fixed_size // dt.itemsize,), codec=codec) as ds:
            for s in range(0, len(payloads), chunk):
                part = payloads[s : s + chunk]
                ds.append(np.frombuffer(b"".join(part), dtype=dt).reshape(len(part), -1))
    else:
        with Ragged.create(store, dt, 1, codec=codec) as rs:
            for s in range(0, len(payloads), chunk):
                rs.append(RaggedBatch.from_records([np.frombuffer(p, dtype=dt) for p in payloads[s : s + chunk]]))


def count_rows(rows, d) -> tuple[int, int]:
    """(records, bytes) of one batch: an array of fixed-size rows or a list of 1-D arrays / bytes;
    each row goes into digest `d` when given (the digest pass)."""
    if d is not None:
        for row in rows:
            d.add(row)
    return len(rows), rows.nbytes if isinstance(rows, np.ndarray) else sum(memoryview(a).nbytes for a in rows)


def _count_loaderx(value, fixed: bool, d) -> tuple[int, int]:
    """`count_rows` for one loaderx batch value (Dense array or Ragged values + cu_seqlens); a
    timed pass does not slice ragged records."""
    if fixed:
        return count_rows(np.from_dlpack(value), d)
    values, cu = np.from_dlpack(value.values), np.from_dlpack(value.cu_seqlens)
    if d is not None:
        for j in range(len(cu) - 1):
            d.add(values[cu[j] : cu[j + 1]])
    return len(cu) - 1, values.nbytes


def loaderx_digest(store: Path, fixed: bool, chunk: int = 256) -> dict:
    """Digest of a loaderx store's records in stored order (positions 0..N-1), read in chunks."""
    from loaderx.zrecord import Dense, Ragged

    d = Digest()
    st = (Dense if fixed else Ragged).open(store)
    try:
        n = len(st)
        for s in range(0, n, chunk):
            _count_loaderx(st[np.arange(s, min(n, s + chunk))], fixed, d)
    finally:
        st.close()
    return d.result()


def run_loaderx(spec: dict) -> dict:
    """loaderx Loader({'data': [store]}, sampler, workers=W) for N/256 steps (the loader is endless).
    Ordered: its Sampler(N, 256, SEQUENTIAL). Shuffled: a PlanSampler replaying datasetrt's order
    (its own IID/CYCLIC modes cannot reproduce that order); worker threads may reorder batches."""
    result = new_result()
    try:
        from loaderx import Loader
        from loaderx.sampler import Sampler
        from loaderx.zrecord import Dense, Ragged

        start = time.perf_counter()
        store = (Dense if spec["fixed"] else Ragged).open(spec["loaderx"])
        n = len(store)
        if n % BATCH:
            result["error"] = f"record count {n} not a multiple of {BATCH}"
            return result
        steps = n // BATCH
        order = plan(spec, n)
        workers = spec["workers"]
        result["note"] = f"Loader workers={workers} threads (digest pass: 1 thread)"
        loaders: list = []

        def one_pass(rep: int):
            """A fresh Loader for this pass (the previous one closed first, outside the clock)."""
            while loaders:
                loaders.pop().close()
            sampler = PlanSampler(order, BATCH) if spec.get("order") else Sampler(n, BATCH, Sampler.Mode.SEQUENTIAL)
            # The loader is endless and its worker threads may deliver batches out of order, so
            # the first `steps` batches of a multi-thread pass can include a wrapped-around batch
            # in place of a late one (seen once: a shuffled multiset mismatch). The digest pass
            # uses one thread, which delivers in sampler order; timed passes use `workers`.
            loader = Loader({"data": [store]}, sampler, workers=1 if rep == 0 else workers, prefetch=4)
            loaders.append(loader)
            return (next(loader)[0]["data"] for _ in range(steps))

        batch_passes(result, spec["repeats"], start, one_pass, lambda value, d: _count_loaderx(value, spec["fixed"], d))
        while loaders:
            loaders.pop().close()
        store.close()
    except Exception as exc:  # a peer API failure is a finding, not a crash
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2000:]
    return result


RUNNERS = {LOADERX: run_loaderx, TORCH_MEMMAP: run_torch, MEMMAP_COPY: run_memmap_copy, PREAD: run_pread_loop}
