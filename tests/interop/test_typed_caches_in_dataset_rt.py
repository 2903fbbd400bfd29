"""Typed caches (WriterConfig(payload_spec=...)) written by datasetrt still read as bytes in the real
dataset-rt 0.4.8, deep validation included: the spec lives only in the manifest's `datasetrt`
section, which dataset-rt ignores, and the records are the payloads' little-endian bytes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.interop._interop import LIBS, Source, open_ds, read_manifest, take, writer_config

pytestmark = pytest.mark.interop

drt = LIBS["drt"]
SPECS = {
    "dense": (drt.PayloadSpec("int32", (4, 2)), [np.arange(8, dtype=np.int32).reshape(4, 2) * i for i in range(12)]),
    "ragged": (
        drt.PayloadSpec("float32", (None, 3)),
        [np.full((i % 5, 3), i / 4, dtype=np.float32) for i in range(12)],
    ),
}


@pytest.mark.parametrize("algo", ["none", "lz4"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_typed_cache_reads_as_bytes_in_dataset_rt(runtimes, tmp_path, kind, algo):
    spec, arrays = SPECS[kind]
    items = [(a, {"i": i, "label": f"l{i % 3}"}) for i, a in enumerate(arrays)]
    (result,) = runtimes["drt"].write_cache(
        [Source(drt, kind, items)], tmp_path, writer_config=writer_config(drt, algo, payload_spec=spec)
    )
    assert type(result).__name__ == "CacheWriteSuccess", result
    assert read_manifest(result.path)["datasetrt"]["payload_spec"] == spec.manifest_form()
    rt_ds = open_ds(runtimes["rt"], LIBS["rt"], [result.path], shuffle=False, validate_cache=True)
    drt_ds = open_ds(runtimes["drt"], drt, [result.path], shuffle=False)
    rt_keys, drt_keys = take(rt_ds), take(drt_ds)
    assert rt_keys == drt_keys
    assert [k[0] for k in rt_keys] == [a.astype(a.dtype.newbyteorder("<")).tobytes() for a in arrays]
    assert all((spec.decode(s.data) == a).all() for s, a in zip(rt_ds, arrays))
    assert drt_ds.payload_spec == spec
