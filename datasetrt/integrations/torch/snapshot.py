"""The population snapshot: an immutable Arrow IPC file holding a `PopulationExport`, so that a
spawned torch DataLoader worker maps the population instead of receiving it pickled.

Boundary: `PopulationExport` <-> one Arrow IPC file; the column names and their meaning belong to
the dataset (`CachedDataset.export_population` / `import_population`), not to this module. No
torch, no Polars; pyarrow is imported inside the functions. (Reader worker processes need no
snapshot: the parent writes each task's planned rows into the task's ring slot.)

Layout: one Arrow column per export column (one row per population row, dtypes as exported),
the export's params as JSON under the schema metadata key `params`, and its stream order (a
mixture or curriculum, if any) pickled under `order` (the file lives in the wrapper's own temp
dir: the same trust as the pickled DataLoader dataset itself). Readers open it with a read-only
memory map, zero copy, so every process shares the same page-cache pages.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from datasetrt.dataset.seam import PopulationExport

if TYPE_CHECKING:
    import pyarrow as pa

SNAPSHOT_NAME = "population.arrow"
PARAMS_KEY = b"params"
ORDER_KEY = b"order"


def write_snapshot(run_dir: Path, export: PopulationExport) -> Path:
    """Write `export` as `run_dir/population.arrow`; returns the path."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    columns = {name: pa.array(np.ascontiguousarray(values)) for name, values in export.columns.items()}
    metadata = {PARAMS_KEY: json.dumps(export.params).encode()}
    if export.order is not None:
        metadata[ORDER_KEY] = pickle.dumps(export.order)
    table = pa.table(columns, metadata=metadata)
    path = run_dir / SNAPSHOT_NAME
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def read_snapshot(path: str | Path) -> tuple[PopulationExport, pa.MemoryMappedFile]:
    """(the export, mapping): its columns are zero-copy views of the mapped file; the caller
    keeps `mapping` alive as long as it uses them."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    source = pa.memory_map(str(path), "r")
    table = ipc.open_file(source).read_all()
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        columns[name] = array.to_numpy(zero_copy_only=True)
    metadata = table.schema.metadata
    params = json.loads(metadata[PARAMS_KEY])
    order = pickle.loads(metadata[ORDER_KEY]) if ORDER_KEY in metadata else None  # written by write_snapshot
    return PopulationExport(columns, params, order), source
