"""The population snapshot: an immutable Arrow IPC file holding a `PopulationExport`, so that a
spawned torch DataLoader worker maps the population instead of receiving it pickled.

Boundary: `PopulationExport` <-> one Arrow IPC file; the column names and their meaning belong to
the dataset (`CachedDataset.export_population` / `import_population`), not to this module. No
torch, no Polars; pyarrow is imported inside the functions. (Reader worker processes need no
snapshot: the parent writes each task's planned rows into the task's ring slot.)

Layout: one Arrow column per export column (one row per population row, dtypes as exported) and
the export's params as JSON under the schema metadata key `params`. Readers open it with a
read-only memory map, zero copy, so every process shares the same page-cache pages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from datasetrt.seam import PopulationExport

if TYPE_CHECKING:
    import pyarrow as pa

SNAPSHOT_NAME = "population.arrow"
PARAMS_KEY = b"params"


def write_snapshot(run_dir: Path, export: PopulationExport) -> Path:
    """Write `export` as `run_dir/population.arrow`; returns the path."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    columns = {name: pa.array(np.ascontiguousarray(values)) for name, values in export.columns.items()}
    table = pa.table(columns, metadata={PARAMS_KEY: json.dumps(export.params).encode()})
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
    params = json.loads(table.schema.metadata[PARAMS_KEY])
    return PopulationExport(columns, params), source
