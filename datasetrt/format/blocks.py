"""Ordered block compression of one source's records, and the per-cache dictionary it trains
and uses (zstd_dict).

Boundary: stored payload bytes and their order; knows nothing of sources, metadata, files or
publication (blocks are committed to a format/shards.py `StagedCache`), tables or processes.

Order: blocks of up to `BLOCK_RECORDS` records (fewer when `prefetch_size` is smaller) are
compressed inline or on the thread pool and committed in submission order, so the output is
byte-identical whatever the number of threads. At most `max_inflight` blocks (`prefetch_size /
block + 1`) wait, compressed or being compressed; blocks under `shards.POOL_MIN_BYTES` of payload
are compressed on the calling thread (a hand-off costs more than the work).

zstd_dict (a codec with per-cache state): `Blocks` holds the source's first blocks uncompressed
until the training sample is full (or the source ends), trains the dictionary from it
(format/dictionary.py: which records, the fallback to plain zstd when training fails), tells the
staged cache which codec its shards record (and the dictionary it stores before the manifest),
then compresses every block with it, the held ones first. One prepared dictionary
(`codec.EncodeState`) is shared by the threads; each pooled task has its own compressor (zstd
contexts are not thread-safe).

Memory: the in-flight blocks (`prefetch_size` records), plus for zstd_dict its held training
sample (at most `dictionary.sample_limit_bytes(dict_bytes)` of payload or
`dictionary.SAMPLE_MAX_RECORDS` records).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Executor, Future
from typing import Any

from datasetrt._native import codec
from datasetrt.format import dictionary
from datasetrt.format.profile import StageProfile
from datasetrt.format.shards import POOL_MIN_BYTES, StagedCache
from datasetrt.values.codecs import CODEC_BY_NAME, Codec
from datasetrt.values.config import WriterConfig

BLOCK_RECORDS = 256


class _Compressor:
    """Turns raw payloads into stored payloads with one codec of the table (datasetrt/values/codecs.py) at
    `level` (thread-confined: it holds the codec's library context). `state` is the cache's
    prepared codec state (`codec.EncodeState`) for a codec that has one (zstd_dict), shared."""

    def __init__(self, codec_row: Codec, level: int, state: Any = None) -> None:
        self.codec = codec_row
        self.level = level
        self.state = state
        self._encoder = None if codec_row.stores_raw else codec.Encoder(codec_row.codec_id, level, state)

    def __call__(self, payloads: list) -> list:
        if self._encoder is None:
            return payloads
        encode = self._encoder.encode
        return [encode(p) for p in payloads]


class Blocks:
    """One source's blocks of encoded records on their way to the shards: compressed inline or on
    the pool, committed in submission order, at most `max_inflight` compressed blocks waiting.

    A codec with per-cache state (zstd_dict) compresses nothing before that state exists: blocks
    are held uncompressed, in order, until the training sample is full or the source ends; then the
    dictionary is trained (or training falls back to plain zstd: format/dictionary.py), the staged
    cache is told which codec its shards record, and the held blocks go out first.
    """

    def __init__(
        self, config: WriterConfig, staged: StagedCache, pool: Executor | None, profile: StageProfile, progress: Any
    ) -> None:
        self.policy = config.shard_compression
        self.staged, self.pool, self.profile, self.progress = staged, pool, profile, progress
        self.block_limit = max(1, min(BLOCK_RECORDS, config.prefetch_size))
        self.max_inflight = max(1, config.prefetch_size // self.block_limit) + 1
        self.inflight: deque[tuple[Future | list, list, list, list]] = deque()
        self.held: list[tuple[list, list, list, list]] = []
        row = CODEC_BY_NAME[self.policy.algo]
        self.sample = dictionary.TrainingSample(self.policy.dict_bytes) if row.cache_state else None
        self.compress: _Compressor | None = None
        if self.sample is None:
            self._use(row, None)

    def push(self, jsons: list, payloads: list, raw_lens: list, values: list) -> None:
        """Take the next block of the source (records in source order)."""
        if self.compress is None:
            assert self.sample is not None  # no compressor yet: the sample is being collected
            self.held.append((jsons, payloads, raw_lens, values))
            if self.sample.add(payloads):
                self._train()
            return
        self._submit(jsons, payloads, raw_lens, values)

    def finish(self) -> None:
        """Every block committed (training first, on whatever sample there is, if still pending)."""
        if self.compress is None:
            self._train()
        while self.inflight:
            self._drain_one()

    def _use(self, row: Codec, data: bytes | None) -> None:
        state = codec.EncodeState(row.codec_id, data, self.policy.level) if data is not None else None
        self.compress = _Compressor(row, self.policy.level, state)
        self.staged.use_codec(row.name, data)

    def _train(self) -> None:
        sample, self.sample = self.sample, None
        assert sample is not None  # trained once
        start = time.perf_counter_ns()
        trained = dictionary.train(sample, self.policy.algo)
        self._use(CODEC_BY_NAME[trained.algo], trained.dictionary)
        self.profile.add("compression", time.perf_counter_ns() - start, sample.nbytes)  # training: part of compression
        held, self.held = self.held, []
        for block in held:
            self._submit(*block)

    def _submit(self, jsons: list, payloads: list, raw_lens: list, values: list) -> None:
        compress = self.compress
        assert compress is not None  # blocks are submitted once the codec is known
        if compress.codec.stores_raw:
            self.inflight.append((payloads, jsons, raw_lens, values))
        elif self.pool is not None and sum(raw_lens) >= POOL_MIN_BYTES:
            # Each pooled task gets its own compressor: zstd contexts are not thread-safe (the
            # prepared dictionary is, and is shared).
            future = self.pool.submit(_compress_block, compress.codec, compress.level, compress.state, payloads)
            self.inflight.append((future, jsons, raw_lens, values))
        else:
            start = time.perf_counter_ns()
            stored = compress(payloads)
            self.profile.add("compression", time.perf_counter_ns() - start, sum(raw_lens))
            self.inflight.append((stored, jsons, raw_lens, values))
        while len(self.inflight) >= self.max_inflight:
            self._drain_one()

    def _drain_one(self) -> None:
        stored, jsons, raw_lens, values = self.inflight.popleft()
        if isinstance(stored, Future):
            stored = stored.result()
        staged = self.staged
        before = staged.bytes_written
        start = time.perf_counter_ns()
        staged.commit(jsons, stored, raw_lens, values)
        self.profile.add("disk_write", time.perf_counter_ns() - start, staged.bytes_written - before)
        if self.progress is not None:
            self.progress.advance(len(jsons), sum(raw_lens))  # payload MB/s, before compression


def _compress_block(codec_row: Codec, level: int, state: Any, payloads: list) -> list:
    return _Compressor(codec_row, level, state)(payloads)
