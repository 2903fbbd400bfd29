"""_native.table: the reader's CacheTable, its construction contract, what it maps and keeps alive,
and the descriptor array it borrows (written by the budget, seen by the kernels, never resized)."""

from __future__ import annotations

from array import array

import pytest

from datasetrt._native.mapped import MappedFile
from datasetrt._native.table import CacheTable
from datasetrt.errors import ArgumentTypeError, ConfigError


def _columns(fds=None) -> dict:
    """Two caches: 'a' (3 rows, 2 shards) and 'b' (5 rows, 1 shard)."""
    return {
        "labels": ["a", "b"],
        "index_rows": [3, 5],
        "shard_count": [2, 1],
        "shard_len": [10, 20, 30],
        "shard_ulen": [10, 20, 30],
        "shard_codec": [0, 0, 1],
        "shard_names": ["a/0", "a/1", "b/0"],
        "shard_fd": array("i", [-1, -1, -1]) if fds is None else fds,
    }


def _table():
    columns = _columns()
    return CacheTable(**columns), columns["shard_fd"]


def _mapped(tmp_path, name, size):
    path = tmp_path / name
    path.write_bytes(b"\0" * size)
    return MappedFile(path)


def test_a_table_describes_its_caches_and_shards():
    table, _fds = _table()
    assert (table.n_caches, table.n_shards, table.unmapped) == (2, 3, 2)
    assert table.labels == ["a", "b"] and table.shard_names == ["a/0", "a/1", "b/0"]
    assert table.index_addr == (0, 0) and table.cksum_addr == (0, 0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"index_rows": [3]}, "2 labels need as many index_rows"),
        ({"shard_count": [2, 2]}, "4 shards need as many names"),
        ({"shard_len": [10, 20]}, "lengths"),
        ({"shard_codec": [0]}, "codecs"),
        ({"shard_fd": array("i", [-1])}, "descriptors"),
    ],
)
def test_lengths_that_disagree_are_refused(change, match):
    with pytest.raises(ConfigError, match=match):
        CacheTable(**{**_columns(), **change})


def test_mapping_points_a_cache_at_its_files_and_keeps_them_alive(tmp_path):
    table, _fds = _table()
    index, sidecar = _mapped(tmp_path, "index.bin", 5 * 24), _mapped(tmp_path, "sidecar", 5 * 8)
    table.map_cache(1, index, sidecar)
    assert table.unmapped == 1
    assert table.index_addr == (0, index.address) and table.cksum_addr == (0, sidecar.address)
    del index, sidecar  # the table holds them: the addresses stay valid
    assert all(table.index_addr[1:]) and all(table.cksum_addr[1:])
    table.map_cache(1, _mapped(tmp_path, "again", 5 * 24))  # mapping again replaces, counts once
    assert table.unmapped == 1 and table.cksum_addr == (0, 0)


def test_unmapped_in_lists_each_waiting_cache_once_in_order_of_first_use(tmp_path):
    table, _fds = _table()
    positions = array("q", [1, 1, 0, 1, 0])
    assert table.unmapped_in(positions) == [1, 0]
    assert table.unmapped_in(positions) == [1, 0]  # asking changes nothing
    table.map_cache(1, _mapped(tmp_path, "index.bin", 5 * 24))
    assert table.unmapped_in(positions) == [0]
    table.map_cache(0, _mapped(tmp_path, "index0.bin", 3 * 24))
    assert table.unmapped == 0 and table.unmapped_in(positions) == []


def test_contract_breaches_are_typed_errors(tmp_path):
    table, _fds = _table()
    with pytest.raises(ConfigError, match="cache position 2 is outside the reader's 2 caches"):
        table.unmapped_in(array("q", [0, 2]))
    assert table.unmapped_in(array("q", [0])) == [0]  # a refused call leaves no trace
    with pytest.raises(ConfigError, match=r"cache 2 is outside \[0, 2\)"):
        table.map_cache(2, _mapped(tmp_path, "index.bin", 0))
    with pytest.raises(ArgumentTypeError, match="takes MappedFile"):
        table.map_cache(0, b"not a mapping")
    with pytest.raises(ArgumentTypeError, match="DecodeState"):
        table.map_cache(0, _mapped(tmp_path, "index2.bin", 0), None, object())


def test_the_borrowed_descriptor_array_cannot_be_resized_while_the_table_lives():
    table, fds = _table()
    fds[2] = 7  # the budget writes entries in place: allowed, and what the kernels read
    with pytest.raises(BufferError):
        fds.append(-1)
    del table
    fds.append(-1)
