"""Hugging Face `datasets` source: a `datasets.Dataset` or `IterableDataset` read as Arrow batches.

Boundary: duck-typed on the dataset's public `with_format("arrow").iter(batch_size)` (so this
module never imports `datasets`, which the `hf` extra installs); no cache format, no processes.
A mapping of splits (`DatasetDict`) is refused when the source is built, naming its splits.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from datasetrt.errors import ArgumentTypeError
from datasetrt.sources.base import BATCH_BYTES, BatchSource, Part
from datasetrt.sources.columns import Columns, Where

DEFAULT_BATCH_ROWS = 1024


class HFDatasetSource(BatchSource):
    """A Hugging Face `datasets.Dataset` (selections, shuffles and filters included: rows come in
    the dataset's order) or `datasets.IterableDataset`, one cache.

    Read `batch_rows` rows at a time (default: about `batch_bytes` of the dataset's Arrow data
    when it knows its size, else 1,024) through the dataset's own Arrow formatting; a Dataset backed
    by cache files is memory-mapped by `datasets`, not copied. Errors name the dataset and the row.
    `len()` is the dataset's (a Dataset; an IterableDataset has none).
    """

    def __init__(
        self,
        name: str,
        dataset: Any,
        *,
        batch_rows: int | None = None,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
        batch_bytes: int = BATCH_BYTES,
        columns: Columns | None = None,
    ) -> None:
        super().__init__(
            name,
            payload=payload,
            metadata=metadata,
            rename=rename,
            payload_spec=payload_spec,
            index_column=index_column,
            batch_bytes=batch_bytes,
            columns=columns,
        )
        if isinstance(dataset, Mapping):  # DatasetDict / IterableDatasetDict: one dataset per split
            splits = list(dataset)
            pick = f"dataset[{splits[0]!r}]" if splits else "one split"
            raise ArgumentTypeError(
                f"dataset must be a datasets.Dataset or IterableDataset, got a {type(dataset).__name__} "
                f"of splits {splits}: pass one split, e.g. {pick}, or one source per split"
            )
        if not (hasattr(dataset, "with_format") and hasattr(dataset, "iter")):
            raise ArgumentTypeError(
                f"dataset must be a datasets.Dataset or IterableDataset, got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.rows_per_batch = batch_rows

    def __len__(self) -> int:
        return len(self.dataset)

    def _label(self) -> str:
        info = getattr(self.dataset, "info", None)
        name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
        return (
            f"Hugging Face dataset {name!r} of source {self.name!r}"
            if name
            else f"Hugging Face dataset of source {self.name!r}"
        )

    def _rows(self) -> int:
        if self.rows_per_batch is not None:
            return self.rows_per_batch
        data = getattr(self.dataset, "data", None)
        nbytes = getattr(data, "nbytes", None)
        try:
            count = len(self.dataset)
        except TypeError:
            count = None
        if nbytes and count:
            return self.batch_rows(nbytes / count)
        return DEFAULT_BATCH_ROWS

    def _parts(self) -> Generator[Part, None, None]:
        label = self._label()
        batches = iter(self.dataset.with_format("arrow").iter(batch_size=self._rows()))
        head = next(batches, None)
        if head is None:
            return
        yield Part(label, head.schema, self._batches(label, head, batches))

    def _batches(self, label: str, head: pa.Table, rest: Iterator[pa.Table]) -> Iterator[tuple[Where, pa.RecordBatch]]:
        row = 0
        table: pa.Table | None = head
        while table is not None:
            batch = table.combine_chunks().to_batches()
            for piece in batch:
                yield Where(label, None, 0, row, 0), piece
                row += piece.num_rows
            table = next(rest, None)
