"""Immutable population snapshot as an Arrow IPC file, for torch DataLoader workers.

Boundary: numpy <-> Arrow IPC file; no Polars. pyarrow is imported inside the functions. Used by
`integrations/torch.py`: a spawned torch worker maps the weighted population instead of receiving
it pickled. (Reader worker processes need none: the parent writes each task's planned rows into
the task's ring slot.)

Columns (one row per active row): cache_pos int64, sample_id uint64, cum float64 (the weighted
sampler's running sums: entries 0..n-2 are used, entry n-1 is padding). Readers open it with a
read-only memory map, zero copy, so every process shares the same page-cache pages.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

SNAPSHOT_NAME = "population.arrow"


def write_snapshot(run_dir: Path, cache_pos: np.ndarray, sample_id: np.ndarray, cum: np.ndarray) -> Path:
    """Write the snapshot; `cum` has len(cache_pos) - 1 entries."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    padded = np.zeros(len(cache_pos), dtype=np.float64)
    padded[: len(cum)] = cum
    table = pa.table(
        {
            "cache_pos": pa.array(np.ascontiguousarray(cache_pos, dtype=np.int64)),
            "sample_id": pa.array(np.ascontiguousarray(sample_id, dtype=np.uint64)),
            "cum": pa.array(padded),
        }
    )
    path = run_dir / SNAPSHOT_NAME
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def read_snapshot(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.MemoryMappedFile]:
    """(cache_pos, sample_id, cum[:n-1], mapping) as zero-copy views of the mapped file.

    The caller keeps `mapping` alive as long as it uses the arrays."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    source = pa.memory_map(str(path), "r")
    table = ipc.open_file(source).read_all()
    cols = [table.column(name).combine_chunks() if table.column(name).num_chunks != 1 else table.column(name).chunk(0)
            for name in ("cache_pos", "sample_id", "cum")]
    cache_pos, sample_id, cum = (c.to_numpy(zero_copy_only=True) for c in cols)
    return cache_pos, sample_id, cum[: max(len(cum) - 1, 0)], source
