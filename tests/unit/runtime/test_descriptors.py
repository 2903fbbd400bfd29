"""runtime/descriptors.py: one budget of shard descriptors over every reader, LRU eviction across
readers, pinned caches never closed, blocks cut to what fits, mapped files holding no descriptor.

Readers here use a private `DescriptorBudget` with a small limit (the same class the process's
`BUDGET` is), so the tests do not depend on what else the test process has open.
"""

from __future__ import annotations

import errno
import gc
import itertools
import os
import resource
import threading

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import CacheIOError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.descriptors import BUDGET, DescriptorBudget, default_limit
from datasetrt.runtime.local import LocalReader
from datasetrt.values.payloads import PayloadCheck
from tests.conftest import ListSource, sample_items, writer_config

CACHES = 8
ROWS = 10


@pytest.fixture(scope="module")
def handles(tmp_path_factory):
    """CACHES caches of ROWS rows: even ones in one shard, odd ones in several (tiny shards)."""
    base = tmp_path_factory.mktemp("budget")
    with drt.DatasetRuntime(num_workers=1) as rt:
        for k in range(CACHES):
            cfg = writer_config(max_shard_bytes=512 if k % 2 else 1 << 20)
            [result] = rt.write_cache(
                ListSource(f"c{k}", sample_items(ROWS, seed=k, tag=f"c{k}")), base, writer_config=cfg
            )
            assert isinstance(result, drt.CacheWriteSuccess), result
    return [CacheHandle.open(base / f"c{k}") for k in range(CACHES)]


def rows_of(*caches):
    """(cache_pos, sample_id) of every row of the given caches, cache by cache."""
    cache_pos = np.repeat(np.array(caches, dtype=np.int64), ROWS)
    sample_id = np.tile(np.arange(ROWS, dtype=np.uint64), len(caches))
    return cache_pos, sample_id


def payloads(chunk):
    return [bytes(chunk.data[o : o + n]) for o, n in zip(chunk.data_off, chunk.data_len)]


def open_caches(reader) -> list[int]:
    shards = reader.shards
    return [k for k in range(len(reader.handles)) if shards.is_open[k]]


def fd_targets() -> list[str]:
    """What this process's descriptors point at (after collecting garbage that may hold some)."""
    gc.collect()
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_the_process_budget_is_half_the_soft_limit():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_limit() == max(16, min(4096, soft // 2)) and BUDGET.limit == default_limit()


def test_readers_share_one_budget_and_the_least_recently_used_cache_goes_first(handles):
    single = [k for k in range(CACHES) if len(handles[k].manifest.shards) == 1]  # 0, 2, 4, 6
    budget = DescriptorBudget(limit=3)
    a, b = LocalReader(handles, budget=budget), LocalReader(handles, budget=budget)
    a.read_chunk(*rows_of(single[0]))
    a.read_chunk(*rows_of(single[1]))
    b.read_chunk(*rows_of(single[2]))
    assert budget.open_count == 3
    a.read_chunk(*rows_of(single[1]))  # a is now the most recently used reader: b's cache goes first
    b.read_chunk(*rows_of(single[3]))
    assert budget.open_count == 3
    assert open_caches(a) == [single[1]] and open_caches(b) == [single[2], single[3]]
    a.read_chunk(*rows_of(single[0]))  # a's own cache comes back; b's older one goes
    assert open_caches(a) == [single[0], single[1]] and open_caches(b) == [single[3]]
    a.close()
    assert budget.open_count == 1 and all(fd == -1 for fd in a.shards.fds)
    b.close()
    assert budget.open_count == 0


def test_a_pinned_cache_is_never_closed_and_a_block_is_cut_to_what_fits(handles):
    """While one reader's gather is in flight (its block pinned), another reader needing room
    gets only the prefix of its block whose caches fit; the pinned descriptors stay valid."""
    budget = DescriptorBudget(limit=4)
    busy, other = LocalReader(handles, budget=budget), LocalReader(handles, budget=budget)
    busy_pos, _ = rows_of(0, 2)
    assert budget.open_block(busy.shards, busy_pos) == len(busy_pos)  # as gather_into does, minus the gather
    pinned_fds = [busy.shards.fds[busy.shards.base[k]] for k in (0, 2)]
    cache_pos, sample_id = rows_of(4, 6, 0)
    out = np.empty(1 << 16, dtype=np.uint8)
    offsets = np.empty((4, len(cache_pos)), dtype=np.int64)
    done, _used, need = other.gather_into(cache_pos, sample_id, out, *offsets)
    assert (done, need) == (2 * ROWS, 0)  # caches 4 and 6 fit beside the two pinned ones; 0 did not
    assert [busy.shards.fds[busy.shards.base[k]] for k in (0, 2)] == pinned_fds
    for fd in pinned_fds:
        os.fstat(fd)  # still open
    budget.unpin(busy.shards)
    reference = LocalReader(handles, budget=DescriptorBudget(limit=64))
    whole = other.read_chunk(cache_pos, sample_id)  # cut again, and gathered on into one chunk
    assert payloads(whole) == payloads(reference.read_chunk(cache_pos, sample_id))
    assert budget.open_count <= 4
    for r in (busy, other, reference):
        r.close()


def test_a_block_wider_than_the_budget_is_read_whole_and_in_order(handles):
    """Every cache, 25 shards in all, through a budget of 3: the first cache of a block is
    always opened, so reads progress one cache at a time and return the same bytes."""
    budget = DescriptorBudget(limit=3)
    reader = LocalReader(handles, budget=budget)
    reference = LocalReader(handles, budget=DescriptorBudget(limit=1000))
    order = np.random.default_rng(5).permutation(CACHES * ROWS)
    cache_pos, sample_id = (np.asarray(a)[order] for a in rows_of(*range(CACHES)))
    got = payloads(reader.read_chunk(cache_pos, sample_id))
    assert got == payloads(reference.read_chunk(cache_pos, sample_id))
    widest = max(len(h.manifest.shards) for h in handles)
    assert budget.open_count <= max(3, widest)
    reader.close()
    reference.close()


@pytest.mark.parametrize("keep_json", [False, True])
def test_a_batch_wider_than_the_budget_is_gathered_block_after_block_in_its_final_layout(handles, keep_json):
    """The batch gather continues each budget-cut block where the last one stopped: one call
    returns the whole batch, payloads back to back, JSON (when kept) stacked from the end."""
    budget = DescriptorBudget(limit=3)
    reader = LocalReader(handles, budget=budget)
    reference = LocalReader(handles, budget=DescriptorBudget(limit=1000))
    order = np.random.default_rng(6).permutation(CACHES * ROWS)
    cache_pos, sample_id = (np.ascontiguousarray(np.asarray(a)[order]) for a in rows_of(*range(CACHES)))
    n = len(cache_pos)
    chunk = reference.read_chunk(cache_pos, sample_id)
    out = np.zeros(1 << 16, dtype=np.uint8)
    offsets = np.empty(n + 1, dtype=np.int64)
    json_off, json_len = (
        (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
        if keep_json
        else (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    )
    done, end, bottom, need = reader.gather_batch_into(
        cache_pos, sample_id, out, offsets, json_off, json_len, PayloadCheck()
    )
    assert (done, need) == (n, 0) and offsets[0] == 0 and end == offsets[-1] == sum(chunk.data_len)
    assert [bytes(out[a:b]) for a, b in itertools.pairwise(offsets)] == payloads(chunk)
    if keep_json:
        assert bottom == len(out) - sum(chunk.json_len)
        assert [bytes(out[o : o + k]) for o, k in zip(json_off, json_len)] == [
            bytes(chunk.data[o : o + k]) for o, k in zip(chunk.json_off, chunk.json_len)
        ]
    else:
        assert bottom == len(out)
    assert budget.open_count <= max(3, max(len(h.manifest.shards) for h in handles))
    reader.close()
    reference.close()


def test_mapped_index_and_sidecar_files_keep_no_descriptor(handles):
    before = len(fd_targets())
    reader = LocalReader(handles, budget=DescriptorBudget(limit=1000))
    reader.read_chunk(*rows_of(*range(CACHES)))
    assert all(reader.table.index_addr) and all(reader.table.cksum_addr)  # every index and sidecar is mapped
    targets = fd_targets()
    sidecar = handles[0].manifest.checksums.file
    assert not [t for t in targets if t.endswith(("index.bin", sidecar))]
    shards = sum(len(h.manifest.shards) for h in handles)
    assert len(targets) - before == shards == reader.budget.open_count
    reader.close()
    assert len(fd_targets()) == before


def test_a_collected_reader_gives_its_descriptors_back(handles):
    budget = DescriptorBudget(limit=100)
    before = len(fd_targets())
    reader = LocalReader(handles, budget=budget)
    reader.read_chunk(*rows_of(*range(CACHES)))
    assert budget.open_count > 0
    del reader
    gc.collect()
    assert budget.open_count == 0 and len(fd_targets()) == before


def test_threads_reading_at_once_stay_within_the_budget(handles):
    """Four threads, each with its own reader, read shuffled rows of every cache through one
    budget of 6; every read returns the reference bytes and the budget is never exceeded by more
    than one cache per gathering thread."""
    budget = DescriptorBudget(limit=6)
    reference = LocalReader(handles, budget=DescriptorBudget(limit=1000))
    widest = max(len(h.manifest.shards) for h in handles)
    peak, errors = [0], []

    def work(seed: int) -> None:
        reader = LocalReader(handles, budget=budget)
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                order = rng.permutation(CACHES * ROWS)[:17]
                cache_pos, sample_id = (np.asarray(a)[order] for a in rows_of(*range(CACHES)))
                got = payloads(reader.read_chunk(cache_pos, sample_id))
                peak[0] = max(peak[0], budget.open_count)
                if got != payloads(LocalReader.read_chunk(reference_for[seed], cache_pos, sample_id)):
                    errors.append(seed)
        except BaseException as exc:
            errors.append(repr(exc))
        finally:
            reader.close()

    reference_for = {seed: LocalReader(handles, budget=DescriptorBudget(limit=1000)) for seed in range(4)}
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert peak[0] <= 6 + 4 * widest and budget.open_count == 0
    for r in (reference, *reference_for.values()):
        r.close()


@pytest.mark.parametrize("number", [errno.EMFILE, errno.ENOENT])
def test_a_shard_that_cannot_be_opened_is_an_io_error_with_its_errno_and_path(handles, monkeypatch, number):
    """Out of descriptors (after giving every unpinned one back), the message says why and what to raise."""
    budget = DescriptorBudget(limit=3)
    reader = LocalReader(handles, budget=budget)

    def failing(path):
        raise OSError(number, os.strerror(number), path)

    monkeypatch.setattr(budget, "_open_file", failing)
    with pytest.raises(CacheIOError) as info:
        reader.read_chunk(*rows_of(0))
    error = info.value
    assert error.errno == number and error.path.endswith("shards/000000.bin")
    text = f"I/O error: {os.strerror(number)} (os error {number}): {error.path}"
    if number == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        text += (
            f" (RLIMIT_NOFILE soft limit {soft}; datasetrt keeps at most 3 shard files open and had 0: "
            "the rest of the program holds the others; raise `ulimit -n`)"
        )
    assert str(error) == text
    reader.close()
    assert budget.open_count == 0
