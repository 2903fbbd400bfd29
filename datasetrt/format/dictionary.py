"""The zstd_dict codec's per-cache dictionary: which records train it, training with its fallback,
and the checked load of the stored file.

Boundary: payload bytes and the files of one cache directory; no tables, no sampling, no processes.
Readers (reader workers included) use only `read_checked`, which imports hashlib lazily and
nothing heavy; the writer-side functions import `zstandard` when they run.

Training sample (bounded and deterministic): the payloads of the source's first records, in source
order, until they hold `sample_limit_bytes(dict_bytes)` bytes (32 x the dictionary size: 1 MiB for
the 32 KiB default) or SAMPLE_MAX_RECORDS records, whichever comes first (the record that crosses
the byte limit is the last one in). zstd suggests ~100 x; 32 x trains faster for about the same
ratio on the records this is for (the measurements: docs/benchmarks.md, "zstd_dict"). The
writer holds those records uncompressed until the dictionary exists, so a write's extra memory is
at most that sample (with its records' metadata), its joined copy while training and the
trainer's ~6 MB. The same input gives the same sample, the same dictionary (ZDICT's fastCover is
deterministic and derives the id from the content) and the same bytes. A first stretch of records
unlike the rest (a sorted source) trains a dictionary that fits the rest less well: the price of
streaming the source once.

Fallback: a sample that cannot train a dictionary does not fail the write. ZDICT refuses fewer
than 7 records (its fastCover trainer needs 5 training samples after a 75/25 split); we refuse
first a sample whose training 75% holds under MIN_TRAINING_BYTES (16) bytes, which crashes zstd's
trainer instead of failing (a source of empty or one-byte payloads). The cache is then written with plain zstd
frames at the same level: its shards record `zstd` and the manifest names no dictionary, which is
what zstd itself advises ("if dictionary training fails, you should use zstd without a
dictionary"). Deterministic too: the same sample fails the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from datasetrt.errors import CacheFormatError, CacheIOError, CodecError, ConfigError, IntegrityError
from datasetrt.format import files

if TYPE_CHECKING:
    from datasetrt.format.manifest import DictionaryFile

SAMPLE_RATIO = 32  # sample bytes per dictionary byte (zstd suggests ~100; see the module doc)
SAMPLE_MAX_RECORDS = 1 << 16  # bounds the records held (and their metadata) when payloads are tiny or empty
FALLBACK_ALGO = "zstd"
_MAGIC = b"\x37\xa4\x30\xec"  # zstd dictionary magic (RFC 8878 section 5), then u32 LE dictionary id


def sample_limit_bytes(dict_bytes: int) -> int:
    """Payload bytes of the training sample for a dictionary of at most `dict_bytes` bytes."""
    return SAMPLE_RATIO * dict_bytes


class TrainingSample:
    """Collects the payloads of a source's first records until the sample is full (see above).

    `add(payloads)` takes one block in source order and returns True once the sample is full;
    records after that are not added. O(records) Python work over the sample only.
    """

    def __init__(self, dict_bytes: int) -> None:
        self.dict_bytes = dict_bytes
        self.limit_bytes = sample_limit_bytes(dict_bytes)
        self.payloads: list = []
        self.nbytes = 0

    @property
    def full(self) -> bool:
        return self.nbytes >= self.limit_bytes or len(self.payloads) >= SAMPLE_MAX_RECORDS

    def add(self, payloads: list) -> bool:
        for payload in payloads:
            if self.full:
                break
            self.payloads.append(payload)
            self.nbytes += len(payload)
        return self.full


@dataclass(frozen=True)
class Trained:
    """The outcome of training: `dictionary` (bytes, None when the sample could not train one),
    the codec the cache is written with (`algo`: zstd_dict, or the fallback), and `reason` (the
    trainer's message when it fell back)."""

    algo: str
    dictionary: bytes | None
    reason: str | None = None


def train(sample: TrainingSample, algo: str) -> Trained:
    """Train the dictionary of codec `algo` (zstd_dict) from `sample`, or fall back (module doc).

    O(sample bytes)."""
    try:
        data = train_state(sample.payloads, sample.dict_bytes)
    except CodecError as exc:
        return Trained(FALLBACK_ALGO, None, str(exc))
    return Trained(algo, data)


def dictionary_id(data: bytes) -> int:
    """The id in a zstd dictionary's header, or 0 when `data` has no dictionary header."""
    if len(data) < 8 or data[:4] != _MAGIC:
        return 0
    return int.from_bytes(data[4:8], "little")


def read_checked(cache_dir: Path | str, entry: DictionaryFile) -> tuple[bytes, os.stat_result]:
    """The dictionary file of `cache_dir` as the manifest `entry` describes it, checked: its size,
    its sha256 and the id in its header; with the fstat of the file read (its identity).
    CacheIOError when it cannot be read (naming the file), CacheFormatError when it is not a
    regular file or its size or id differs, IntegrityError on a sha256 mismatch. O(byte_len)."""
    import hashlib  # lazily: reader workers import it only for caches with a dictionary

    path = os.path.join(cache_dir, entry.file)
    try:
        fd, st = files.open_regular(path)  # a FIFO or device is refused, never waited on or read on
        try:
            data = os.read(fd, entry.byte_len + 1)  # byte_len <= DICT_MAX_BYTES: one read
        finally:
            os.close(fd)
    except OSError as exc:
        raise CacheIOError.from_os(exc, path) from None
    if len(data) != entry.byte_len:
        raise CacheFormatError(
            f"dictionary length mismatch for {path}: {len(data)} bytes, manifest byte_len {entry.byte_len}"
        )
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise IntegrityError(f"checksum mismatch for {path}")
    found = dictionary_id(data)
    if found != entry.dict_id:
        raise CacheFormatError(
            f"dictionary id mismatch for {path}: the file has id {found}, the manifest says {entry.dict_id}"
        )
    return data, st


TRAIN_SPLIT = 0.75  # ZDICT fastCover's training share of the samples (the rest measures)
MIN_TRAINING_BYTES = 16  # fastCover needs >= 8 (its d and sizeof(U64)); 16 leaves a margin


def train_state(payloads: list[bytes], capacity: int) -> bytes:
    """A zstd dictionary of at most `capacity` bytes trained from `payloads`: exactly what
    ZDICT_trainFromBuffer returns (fastCover, d=8, f=20, 4 steps, accel 1; byte-identical on this
    machine's libzstd), through the `zstandard` package because Debian's libzstd.a holds its
    dictionary builder as PIE objects no shared kernel can link (_ext/clibs.pxd). Deterministic:
    the same payloads give the same bytes. CodecError naming the library's reason when they cannot
    train one; ConfigError for a capacity under 256 bytes (zstd's floor)."""
    import zstandard  # lazily: readers never train

    if capacity < 256:
        raise ConfigError(f"train_state: dictionary capacity {capacity} is under zstd's 256-byte floor")
    # fastCover trains on the first 75% of the samples and crashes the process (SIGSEGV/SIGFPE in
    # zstd 1.5.4-1.5.7) when those hold under 8 bytes instead of returning an error: refuse first.
    training = sum(len(p) for p in payloads[: int(len(payloads) * TRAIN_SPLIT)])
    if training < MIN_TRAINING_BYTES:
        raise CodecError(
            f"zstd_dict training failed on {len(payloads)} samples of {sum(map(len, payloads))} bytes: "
            f"their first {TRAIN_SPLIT:.0%} hold {training} bytes, under the {MIN_TRAINING_BYTES} "
            "the trainer needs"
        )
    try:
        trained = zstandard.train_dictionary(capacity, list(payloads), d=8, f=20, steps=4, accel=1, threads=0)
    except zstandard.ZstdError as exc:
        total = sum(len(p) for p in payloads)
        raise CodecError(f"zstd_dict training failed on {len(payloads)} samples of {total} bytes: {exc}") from exc
    return trained.as_bytes()
