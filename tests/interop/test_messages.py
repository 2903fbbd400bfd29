"""Error messages against the real dataset-rt 0.4.8: each of datasetrt's messages starts with
dataset-rt's text for the same input (its users match on it), then says where and what: the
sample's position in its source, the column and the value (issue 15 item 6)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.integrity.corrupt import METADATA_FRAMINGS
from tests.interop._interop import LIBS, Source, writer_config

pytestmark = pytest.mark.interop


def _write_message(runtimes, tmp_path, label: str, items: list) -> str:
    lib = LIBS[label]
    [result] = runtimes[label].write_cache(
        [Source(lib, "bad", items)], tmp_path / label, writer_config=writer_config(lib, "none")
    )
    assert type(result).__name__ == "CacheWriteError", result
    return result.message


# (id, items, what datasetrt adds after dataset-rt's message)
WRITE_CASES = [
    (
        "empty-metadata",
        [(b"x", {})],
        ": sample 0: the metadata is an empty dict {}; a source's samples need at least one metadata column",
    ),
    (
        "unencodable-str",
        [(b"x", {"label": "ok", "n": 1}), (b"y", {"label": "\udcff", "n": 2})],
        ": sample 1, column 'label': the value '\\udcff' is a str that UTF-8 cannot encode "
        "(surrogates not allowed: '\\udcff' at index 0)",
    ),
    (
        "unencodable-inside-str",
        [(b"x", {"label": "caf\udce9 au lait"})],
        ": sample 0, column 'label': the value 'caf\\udce9 au lait' is a str that UTF-8 cannot encode "
        "(surrogates not allowed: '\\udce9' at index 3)",
    ),
    (
        "none-value",
        [(b"x", {"a": 1}), (b"y", {"a": 2}), (b"z", {"a": None})],
        ": sample 2, column 'a': got NoneType None",
    ),
    ("kind-change", [(b"x", {"a": 1}), (b"y", {"a": 1.5})], ": sample 1: value 1.5"),
]


@pytest.mark.parametrize(("items", "detail"), [c[1:] for c in WRITE_CASES], ids=[c[0] for c in WRITE_CASES])
def test_write_messages_start_with_dataset_rt_s_and_name_sample_column_value(runtimes, tmp_path, items, detail):
    theirs = _write_message(runtimes, tmp_path, "rt", items)
    ours = _write_message(runtimes, tmp_path, "drt", items)
    assert ours == theirs + detail


def test_update_metadata_weight_message_names_row_identity_and_value(runtimes, tmp_path):
    items = [(bytes([i]), {"i": i}) for i in range(8)]
    messages = {}
    for label, lib in LIBS.items():
        rt = runtimes[label]
        [result] = rt.write_cache(
            [Source(lib, "eight", items)], tmp_path / label, writer_config=writer_config(lib, "none")
        )
        ds = rt.cached_dataset([result.path], reader_config=lib.ReaderConfig(seed=0))
        md = ds.get_metadata()
        with pytest.raises(ValueError) as info:
            ds.update_metadata(md.with_columns(weight=pl.when(pl.int_range(pl.len()) == 5).then(-2.0).otherwise(1.0)))
        messages[label] = (str(info.value), int(md["cache_id"][0]))
    theirs, _ = messages["rt"]
    ours, cache_id = messages["drt"]
    assert theirs == "weight 5 must be positive and finite"
    assert ours == f"{theirs}: row 5 (cache_id={cache_id}, sample_id=5) has weight -2.0"


@pytest.fixture(scope="module")
def one_cache(tmp_path_factory, runtimes):
    [result] = runtimes["rt"].write_cache(
        [Source(LIBS["rt"], "framed", [(b"x", {"i": 1}), (b"y", {"i": 2})])],
        tmp_path_factory.mktemp("framing"),
        writer_config=writer_config(LIBS["rt"]),
    )
    return result.path


@pytest.mark.parametrize("data", [f[1] for f in METADATA_FRAMINGS], ids=[f[0] for f in METADATA_FRAMINGS])
def test_metadata_arrow_framing_refusals_take_dataset_rt_s_builtin_class(runtimes, one_cache, tmp_path, data):
    """Each damaged metadata.arrow framing of tests/integrity/corrupt.py: datasetrt's error is an
    instance of the builtin dataset-rt raises (ValueError or RuntimeError), and where dataset-rt's
    message is its own framing text, datasetrt's starts with it."""
    raised = {}
    for label, lib in LIBS.items():
        cache = Path(shutil.copytree(one_cache, tmp_path / label))
        (cache / "metadata.arrow").write_bytes(data)
        ds = runtimes[label].cached_dataset([str(cache)], reader_config=lib.ReaderConfig(seed=0))
        with pytest.raises(Exception) as info:
            ds.get_metadata()
        raised[label] = info.value
    theirs, ours = raised["rt"], raised["drt"]
    assert type(theirs) in (ValueError, RuntimeError)
    assert isinstance(ours, type(theirs)), (ours, theirs)
    if str(theirs).startswith(("invalid metadata Arrow footer", "Arrow error")):
        assert str(ours).startswith(str(theirs)), (ours, theirs)
