"""The codec table: every payload codec a cache may use, its manifest name, kernel id, levels and limits.

Boundary: pure constants (no I/O, no numpy, no pydantic), so config validation (layer 1), the
manifest parser, writer and reader (layer 2), the runtime's gatherer and the reader workers can all
import it. It sits in layer 1, not in `format/`, because `config.py` (layer 1) reads it.

Its native twin is `_ext/codecs.pxd`: the same ids as a C enum, the kernel-side limits (lz4 block
size, the largest plausible decoded/stored ratio of each codec) and each codec's encode / decode
helpers, which `codec.pyx` (writer) and `gather.pyx` (reader) call through one dispatch. The
twins must agree; `tests/unit/values/test_codecs.py` checks every id and limit against the compiled kernels.

Adding a codec (docs/architecture.md, "Where to make a change"): a `Codec` row here; in
`_ext/codecs.pxd` its id, limits and one branch in each helper (`decoded_size`, `decode`,
`encode_bound`, `encode`, and the context init/free when it keeps a library context); the library's
declarations in `_ext/clibs.pxd` when it needs new ones; docs/storage-format.md.

Per-cache state (`Codec.cache_state`; zstd_dict): a codec whose records need state shared
by the whole cache (a trained dictionary) keeps it in a file of the cache named by the manifest
(format/dictionary.py). Readers load it once per cache and process, like the index map
(`CacheHandle.codec_state`), and hand the kernel a pointer to the prepared native state (a
`ZSTD_DDict`) per cache, which `decode()` receives as `cache_state` (NULL for every other codec).
The writer trains the state from the source's first records and builds its encoders with it
(`codec.EncodeState`, shared by the writer threads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LevelRule:
    """The compression levels a codec takes.

    `default` is used when the config names none; `ShardCompression.level` accepts
    [config_min, config_max]; a manifest may record any level of [manifest_min, manifest_max] (the
    library's whole range, so caches written with other settings still open).
    """

    default: int
    config_min: int
    config_max: int
    manifest_min: int
    manifest_max: int


@dataclass(frozen=True)
class Codec:
    """One row of the codec table.

    `name` is the manifest's `compression.algo` and `ShardCompression.algo`; `codec_id` the u8 the
    kernels dispatch on (equal to `CodecId` in `_ext/codecs.pxd`; never reused: it is not on disk,
    but reader workers and parents must agree). `level` is None for codecs without levels (their
    manifests record none). `max_payload_bytes` is the largest payload the codec can store (None:
    no limit of its own). `cache_state` is True when its records decode only with state shared by
    the whole cache (zstd_dict: the cache's trained dictionary file, named in the manifest).
    """

    name: str
    codec_id: int
    level: LevelRule | None
    max_payload_bytes: int | None
    cache_state: bool = False

    @property
    def stores_raw(self) -> bool:
        """True for the identity codec: stored payload == payload, nothing to encode or decode."""
        return self.codec_id == NONE_ID


NONE_ID = 0
LZ4_MAX_BLOCK_BYTES = 0x7E000000  # LZ4_MAX_INPUT_SIZE: the largest lz4 block, raw or stored

CODECS: tuple[Codec, ...] = (
    Codec("none", NONE_ID, level=None, max_payload_bytes=None),
    # u32 LE decoded length + one raw LZ4 block (lz4_flex compress_prepend_size), as dataset-rt.
    Codec("lz4", 1, level=None, max_payload_bytes=LZ4_MAX_BLOCK_BYTES),
    # One zstd frame with its content size in the header (datasetrt only: dataset-rt 0.4.8 cannot
    # read it). Manifests accept the library's whole range (ZSTD_minCLevel() is -131072); the
    # config keeps to the useful one.
    Codec("zstd", 2, level=LevelRule(3, -7, 22, -131072, 22), max_payload_bytes=None),
    # One zstd frame per record compressed with the cache's trained dictionary, whose id the frame
    # header names (datasetrt only). The dictionary is a file of the cache (format/dictionary.py).
    Codec("zstd_dict", 3, level=LevelRule(3, -7, 22, -131072, 22), max_payload_bytes=None, cache_state=True),
)

CODEC_BY_NAME: dict[str, Codec] = {c.name: c for c in CODECS}
CODEC_BY_ID: dict[int, Codec] = {c.codec_id: c for c in CODECS}
CODEC_NAMES: tuple[str, ...] = tuple(c.name for c in CODECS)
CODEC_IDS: dict[str, int] = {c.name: c.codec_id for c in CODECS}

_LEVELS = [c.level for c in CODECS if c.level is not None]
# ShardCompression has one `level` field for every algo (codecs without levels ignore it): its
# bounds are the union of the codecs' config ranges, its default the first levelled codec's.
CONFIG_LEVEL_DEFAULT = _LEVELS[0].default
CONFIG_LEVEL_MIN = min(r.config_min for r in _LEVELS)
CONFIG_LEVEL_MAX = max(r.config_max for r in _LEVELS)
MANIFEST_LEVEL_MIN = min(r.manifest_min for r in _LEVELS)
MANIFEST_LEVEL_MAX = max(r.manifest_max for r in _LEVELS)
del _LEVELS


# zstd_dict's dictionary size (`ShardCompression.dict_bytes`): the most bytes training may produce.
# 32 KiB by default: on token and JSON-like records 16, 32 and 64 KiB dictionaries compressed
# within 1% of each other, and a smaller one trains faster and costs each reading process less
# (docs/benchmarks.md, "zstd_dict"; loaderx fixes 32 KiB for the same reason). The manifest accepts
# a dictionary file of at most DICT_MAX_BYTES, so a hostile size is refused before it is read.
DICT_BYTES_DEFAULT = 32 << 10
DICT_MIN_BYTES = 1 << 10
DICT_MAX_BYTES = 1 << 20


def names_listed() -> str:
    """ "`none`, `lz4`, `zstd`, `zstd_dict`": the names as serde lists a variant's alternatives in messages."""
    return ", ".join(f"`{name}`" for name in CODEC_NAMES)
