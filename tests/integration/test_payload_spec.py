"""CachedDataset.payload_spec: the caches' common spec, or None; caches that disagree (typed and
untyped, or two specs) are refused at open naming both paths; reusing an existing cache whose spec
is not the writer's is a per-source error."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError
from tests.conftest import ListSource, writer_config

INT4 = drt.PayloadSpec("int32", (4,))


def _write(runtime, base, name, spec, n=3):
    items = [(np.full(4, i, dtype=np.int32).tobytes(), {"i": i}) for i in range(n)]  # 16 bytes fit every spec here
    (result,) = runtime.write_cache([ListSource(name, items)], base, writer_config=writer_config(payload_spec=spec))
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def test_common_spec_is_the_datasets(reader_runtime, open_ds, tmp_path):
    paths = [_write(reader_runtime, tmp_path, name, INT4) for name in ("a", "b")]
    ds = open_ds(paths)
    assert ds.payload_spec == INT4
    assert [INT4.decode(s.data).tolist() for s in ds] == [[i] * 4 for i in range(3)] * 2
    assert open_ds([_write(reader_runtime, tmp_path, "plain", None)]).payload_spec is None


@pytest.mark.parametrize(
    "other",
    [None, drt.PayloadSpec("int32", (None,)), drt.PayloadSpec("float32", (4,))],
    ids=["untyped", "ragged", "dtype"],
)
def test_disagreeing_caches_are_refused_naming_both_paths(reader_runtime, open_ds, tmp_path, other):
    typed = _write(reader_runtime, tmp_path, "typed", INT4)
    odd = _write(reader_runtime, tmp_path, "odd", other)
    for paths in ([typed, odd], [odd, typed]):
        with pytest.raises(CacheFormatError, match="same payload spec") as info:
            open_ds(paths)
        assert str(paths[0]) in str(info.value) and str(paths[1]) in str(info.value)
        assert "int32[4]" in str(info.value)


def test_reusing_a_cache_with_another_spec_is_a_source_error(reader_runtime, tmp_path):
    _write(reader_runtime, tmp_path, "tokens", INT4)
    items = [(np.zeros(2, dtype=np.int32), {"i": 0})]
    config = drt.ReaderConfig(seed=0)
    other = writer_config(payload_spec=drt.PayloadSpec("int32", (2,)))
    result = reader_runtime.from_cache_sources(
        [ListSource("tokens", items)], tmp_path, reader_config=config, writer_config=other
    )
    assert isinstance(result, drt.CacheSourcesDatasetError)
    assert "int32[4]" in result.results[0].message and "int32[2]" in result.results[0].message
    same = reader_runtime.from_cache_sources(
        [ListSource("tokens", items)], tmp_path, reader_config=config, writer_config=writer_config(payload_spec=INT4)
    )
    assert same.dataset.payload_spec == INT4  # reused as it is: the source is not iterated
