"""The float caveat stated in README.md and docs/storage-format.md, checked against dataset-rt
0.4.8: its validate_cache=True rejects float metadata whose JSON it parses one digit off (i * 0.1
at sample 14 = 1.4000000000000001), whichever library wrote the cache; without validate_cache it
reads them with that value one ulp off (1.4); datasetrt reads the exact values either way."""

from __future__ import annotations

import pytest

from tests.interop._interop import LIBS, Source, writer_config

pytestmark = pytest.mark.interop

ITEMS = [(b"x", {"i": i, "q": i * 0.1}) for i in range(20)]


@pytest.mark.parametrize("writer", list(LIBS))
def test_dataset_rt_validate_cache_rejects_some_floats_from_either_writer(runtimes, tmp_path, writer):
    lib = LIBS[writer]
    [written] = runtimes[writer].write_cache([Source(lib, "floats", ITEMS)], tmp_path, writer_config=writer_config(lib))
    rt = LIBS["rt"]
    strict = runtimes["rt"].cached_dataset(
        [written.path], reader_config=rt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    )
    with pytest.raises(ValueError, match="^embedded metadata does not match metadata.arrow for sample 14$"):
        list(strict)
    plain = runtimes["rt"].cached_dataset([written.path], reader_config=rt.ReaderConfig(seed=0, shuffle=False))
    got = [s.metadata["q"] for s in plain]
    assert got[14] == 1.4 != ITEMS[14][1]["q"] == 1.4000000000000001  # parsed one ulp off
    assert got[:14] == [md["q"] for _, md in ITEMS[:14]]
    drt = LIBS["drt"]
    ours = runtimes["drt"].cached_dataset(
        [written.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    )
    assert [s.metadata["q"] for s in ours] == [md["q"] for _, md in ITEMS]
