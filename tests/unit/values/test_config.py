"""Config models: dataset-rt 0.4.8 field compatibility (§1.2), freezing, extra-key policy, limits.

datasetrt additions checked here: WriterConfig.record_checksums, ShardCompression.level,
ShardCompression.dict_bytes and algo="zstd" / "zstd_dict", ReaderConfig.verify_records. Other additions are allowed as long as every
dataset-rt field keeps its default.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

import datasetrt as drt
from datasetrt.values import config

# dataset-rt 0.4.8 WriterConfig().model_dump(), verbatim from the reference.
REFERENCE_WRITER_DUMP = {
    "num_processes": 0,
    "process_timeout_seconds": 3600.0,
    "prefetch_size": 64,
    "max_shard_bytes": 67108864,
    "shard_compression": {"algo": "none", "ratio": 1.0},
    "show_progress": True,
    "validate_cache": False,
    "profiler": {"enabled": False, "path": Path("dataset_rt_profile.json")},
}
REFERENCE_READER_DUMP = {"seed": 5, "prefetch_size": 64, "shuffle": True, "validate_cache": False}


def _error_types(exc_info) -> set[str]:
    return {e["type"] for e in exc_info.value.errors()}


def test_writer_defaults_equal_dataset_rt_plus_additions():
    dump = drt.WriterConfig().model_dump()
    expected = dict(REFERENCE_WRITER_DUMP)
    expected["shard_compression"] = {"algo": "none", "ratio": 1.0, "level": 3, "dict_bytes": 32768}
    expected["record_checksums"] = True
    assert {k: dump[k] for k in expected} == expected
    assert list(dump)[: len(REFERENCE_WRITER_DUMP)] == list(REFERENCE_WRITER_DUMP)


def test_reader_defaults_equal_dataset_rt_plus_additions():
    dump = drt.ReaderConfig(seed=5).model_dump()
    assert {k: dump[k] for k in REFERENCE_READER_DUMP} == REFERENCE_READER_DUMP
    assert dump["verify_records"] is True


def test_defaults_match_installed_dataset_rt():
    ref = pytest.importorskip("dataset_rt")

    def contains(ours: dict, theirs: dict) -> None:
        for key, value in theirs.items():
            if isinstance(value, dict):
                contains(ours[key], value)
            else:
                assert ours[key] == value, key

    contains(drt.WriterConfig().model_dump(), ref.WriterConfig().model_dump())
    contains(drt.ReaderConfig(seed=1).model_dump(), ref.ReaderConfig(seed=1).model_dump())
    contains(drt.ShardCompression().model_dump(), ref.ShardCompression().model_dump())
    contains(drt.WriterProfilerConfig().model_dump(), ref.WriterProfilerConfig().model_dump())


def test_default_constants():
    assert drt.WriterConfig() == config.DEFAULT_WRITER_CONFIG
    assert drt.ShardCompression() == config.DEFAULT_SHARD_COMPRESSION
    assert drt.WriterProfilerConfig() == config.DEFAULT_WRITER_PROFILER_CONFIG
    assert config.DEFAULT_MAX_SHARD_BYTES == 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (drt.WriterConfig, "prefetch_size", 1),
        (lambda: drt.ReaderConfig(seed=1), "seed", 2),
        (drt.ShardCompression, "algo", "lz4"),
        (drt.WriterProfilerConfig, "enabled", True),
    ],
)
def test_models_are_frozen_and_hashable(make, field, value):
    model = make()
    with pytest.raises(ValidationError) as exc_info:
        setattr(model, field, value)
    assert _error_types(exc_info) == {"frozen_instance"}
    assert hash(model) == hash(make()) and model == make()


@pytest.mark.parametrize("cls", [drt.WriterConfig, lambda **kw: drt.ReaderConfig(seed=1, **kw)])
def test_writer_and_reader_forbid_extra_keys(cls):
    with pytest.raises(ValidationError) as exc_info:
        cls(bogus=1)
    assert _error_types(exc_info) == {"extra_forbidden"}


def test_shard_compression_and_profiler_ignore_extra_keys():
    assert drt.ShardCompression(algo="lz4", future=1) == drt.ShardCompression(algo="lz4")
    assert "future" not in drt.ShardCompression(future=1).model_dump()
    assert drt.WriterProfilerConfig(future=1) == drt.WriterProfilerConfig()


def test_reader_config_requires_seed():
    with pytest.raises(ValidationError) as exc_info:
        drt.ReaderConfig()
    assert _error_types(exc_info) == {"missing"}


@pytest.mark.parametrize("seed", [-1, 2**64, "5"])
def test_reader_seed_is_not_range_checked_by_pydantic(seed):
    """As dataset-rt: out-of-u64 seeds fail later, when the dataset is built; "5" is coerced."""
    assert drt.ReaderConfig(seed=seed).seed == int(seed)


@pytest.mark.parametrize("algo", ["bogus", "LZ4", "", None])
def test_unknown_compression_algo_rejected(algo):
    with pytest.raises(ValidationError) as exc_info:
        drt.ShardCompression(algo=algo)
    assert _error_types(exc_info) <= {"literal_error", "string_type"}


def test_zstd_is_a_datasetrt_addition():
    """Differs from dataset-rt 0.4.8, whose ShardCompression only accepts "none" and "lz4"."""
    comp = drt.ShardCompression(algo="zstd", level=19)
    assert (comp.algo, comp.level, comp.ratio) == ("zstd", 19, 1.0)


@pytest.mark.parametrize(
    ("cls", "kwargs", "error"),
    [
        (drt.WriterConfig, {"num_processes": -1}, "greater_than_equal"),
        (drt.WriterConfig, {"process_timeout_seconds": 0}, "greater_than"),
        (drt.WriterConfig, {"process_timeout_seconds": math.inf}, None),
        (drt.WriterConfig, {"process_timeout_seconds": math.nan}, None),
        (drt.WriterConfig, {"prefetch_size": 0}, "greater_than"),
        (drt.WriterConfig, {"max_shard_bytes": 0}, "greater_than"),
        (drt.ShardCompression, {"ratio": 0}, "greater_than"),
        (drt.ShardCompression, {"ratio": -1.5}, "greater_than"),
        (drt.ShardCompression, {"level": 23}, "less_than_equal"),
        (drt.ShardCompression, {"level": -8}, "greater_than_equal"),
        (lambda **kw: drt.ReaderConfig(seed=1, **kw), {"prefetch_size": 0}, "greater_than"),
    ],
)
def test_constraints(cls, kwargs, error):
    with pytest.raises(ValidationError) as exc_info:
        cls(**kwargs)
    if error is not None:
        assert error in _error_types(exc_info)


def test_ratio_with_none_is_accepted_by_the_model():
    """The ratio/algo rule is enforced at write_cache time (test_writer), as in dataset-rt."""
    assert drt.ShardCompression(algo="none", ratio=2).ratio == 2.0


def test_nested_dicts_and_dump_round_trip():
    cfg = drt.WriterConfig(
        shard_compression={"algo": "lz4", "ratio": 1.5},
        profiler={"enabled": True, "path": "p.json"},
        show_progress=False,
    )
    assert cfg.shard_compression == drt.ShardCompression(algo="lz4", ratio=1.5)
    assert cfg.profiler.path == Path("p.json")
    assert drt.WriterConfig(**cfg.model_dump()) == cfg
    reader = drt.ReaderConfig(seed=3, shuffle=False, verify_records=False)
    assert drt.ReaderConfig(**reader.model_dump()) == reader


def test_reader_sampling_mode():
    assert drt.ReaderConfig(seed=1).sampling == "draws"  # dataset-rt's orders stay the default
    assert drt.ReaderConfig(seed=1, sampling="permutation").sampling == "permutation"
    with pytest.raises(ValidationError, match="needs shuffle=True"):
        drt.ReaderConfig(seed=1, sampling="permutation", shuffle=False)
    with pytest.raises(ValidationError):
        drt.ReaderConfig(seed=1, sampling="random")
