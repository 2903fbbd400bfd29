"""`write_cache` and the sources' payload specs (dataset/runtime.py, `with_sources_spec`): a spec
every source declares is recorded when the WriterConfig gives none; a source whose spec differs
from the writer config's, or sources of one call that disagree, raise PayloadSpecMismatchError
naming them before anything is written."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, PayloadSpecMismatchError
from datasetrt.sources import NumpySource, ParquetSource
from tests.conftest import ListSource

QUIET = drt.WriterConfig(show_progress=False)


def _numpy(name, dtype="float32"):
    return NumpySource(name, np.arange(24, dtype=dtype).reshape(4, 6), metadata={"i": np.arange(4)})


def _write(sources, base, config=QUIET):
    with drt.DatasetRuntime(num_workers=1) as rt:
        return rt.write_cache(sources, base, writer_config=config)


def test_the_spec_every_source_declares_is_recorded(tmp_path):
    results = _write([_numpy("a"), _numpy("b")], tmp_path)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results), results
    ds = drt.CachedDataset([r.path for r in results], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == drt.PayloadSpec("float32", (6,))
    [batch] = list(ds.iter_batches(8))
    assert batch.to_numpy().tolist() == [list(map(float, range(k * 6, k * 6 + 6))) for k in range(4)] * 2


def test_a_parquet_list_column_source_is_typed_without_a_writer_spec(tmp_path):
    pq.write_table(pa.table({"data": [[1, 2], [3]], "i": [0, 1]}), tmp_path / "f.parquet")
    [res] = _write(ParquetSource("p", tmp_path / "f.parquet", payload="data"), tmp_path / "out")
    ds = drt.CachedDataset([res.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == drt.PayloadSpec("int64", (None,))


def test_a_source_spec_unlike_the_writer_configs_is_refused(tmp_path):
    config = QUIET.model_copy(update={"payload_spec": drt.PayloadSpec("int32", (6,))})
    with pytest.raises(
        PayloadSpecMismatchError,
        match=r"source 'a' has payload spec float32\[6\].*WriterConfig.payload_spec is int32\[6\]",
    ) as info:
        _write([_numpy("a")], tmp_path, config)
    assert isinstance(info.value, ConfigError) and not any(tmp_path.iterdir())  # nothing written
    same = QUIET.model_copy(update={"payload_spec": drt.PayloadSpec("float32", (6,))})
    assert isinstance(_write([_numpy("a")], tmp_path, same)[0], drt.CacheWriteSuccess)


def test_sources_that_disagree_are_refused(tmp_path):
    with pytest.raises(PayloadSpecMismatchError, match=r"'a': float32\[6\], 'b': int64\[6\]\) and WriterConfig"):
        _write([_numpy("a"), _numpy("b", "int64")], tmp_path)
    plain = ListSource("plain", [(b"xy", {"i": 0})])  # declares no spec: its bytes are not typed
    with pytest.raises(PayloadSpecMismatchError, match=r"'a': float32\[6\] and 1 source\(s\) that declare none"):
        _write([_numpy("a"), plain], tmp_path)
    assert not any(tmp_path.iterdir())


def test_untyped_sources_stay_untyped(tmp_path):
    plain = ListSource("plain", [(b"xy", {"i": 0})])
    [res] = _write([plain], tmp_path)
    assert drt.CachedDataset([res.path], reader_config=drt.ReaderConfig(seed=0)).payload_spec is None
