"""The records of the object-storage benchmark (benchmarks.remote) and the checks every contender
runs on what it read, so no figure can come from reading less or other bytes.

Records: N payloads of SIZE bytes each, record i = its index as u64 little-endian, then SIZE-8
seeded random bytes (numpy default_rng(seed)); its label (an int, stored beside the payload by
every contender) is i % 1000. The orchestrator writes them once to a flat file (`records.bin`,
record i at i * SIZE) that each contender's writer reads.

Checks (`Tally`, on every timed pass; cheap: two u64 per record): every index 0..N-1 delivered
exactly once, the sum mod 2**64 of each payload's last 8 bytes (as u64) equal to the written
one, every label equal to index % 1000, and the payload bytes counted. The full check (the
order-free multiset digest of every payload, benchmarks.common.Digest) runs on one extra,
untimed pass per contender.

Boundary: numpy and the standard library only (it is imported by the peers' venv too).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LABELS = 1000
MASK = (1 << 64) - 1


def write_records(path: Path, count: int, size: int, seed: int) -> dict:
    """Write the flat file; returns {"count", "size", "tail_sum", "bytes"} (what a Tally expects)."""
    rng = np.random.default_rng(seed)
    tail_sum = 0
    chunk = max(1, (32 << 20) // size)
    with open(path, "wb") as f:
        for s in range(0, count, chunk):
            n = min(chunk, count - s)
            block = rng.integers(0, 256, (n, size), dtype=np.uint8)
            block[:, :8] = np.arange(s, s + n, dtype="<u8").view(np.uint8).reshape(n, 8)
            tail_sum = (tail_sum + int(block[:, -8:].copy().view("<u8").sum(dtype=np.uint64))) & MASK
            f.write(block.tobytes())
    return {"count": count, "size": size, "tail_sum": tail_sum, "bytes": count * size}


def read_records(path: str, size: int) -> np.ndarray:
    """The flat file as an [N, SIZE] uint8 memmap."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return mm.reshape(-1, size)


class Tally:
    """The checks of one pass (see the module docstring): `add_rows` for an [n, SIZE] array of
    payloads, `add_list` for a sequence of bytes-like payloads; `labels` beside either."""

    def __init__(self, expect: dict) -> None:
        self.expect = expect
        self.ids: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.tail = 0
        self.samples = 0
        self.bytes = 0

    def add_rows(self, rows: np.ndarray, labels) -> None:
        rows = rows.reshape(len(rows), -1)
        self.ids.append(rows[:, :8].copy().view("<u8").ravel())
        self.tail = (self.tail + int(rows[:, -8:].copy().view("<u8").sum(dtype=np.uint64))) & MASK
        self.labels.append(np.asarray(labels, dtype=np.int64).ravel())
        self.samples += len(rows)
        self.bytes += rows.nbytes

    def add_list(self, payloads, labels) -> None:
        ids = np.empty(len(payloads), dtype=np.uint64)
        for j, p in enumerate(payloads):
            mv = memoryview(p).cast("B")
            ids[j] = int.from_bytes(mv[:8], "little")
            self.tail = (self.tail + int.from_bytes(mv[-8:], "little")) & MASK
            self.bytes += mv.nbytes
        self.ids.append(ids)
        self.labels.append(np.asarray(labels, dtype=np.int64).ravel())
        self.samples += len(payloads)

    def problems(self) -> list[str]:
        """What does not match the written records (empty when everything does)."""
        n = self.expect["count"]
        out = []
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.uint64)
        labels = np.concatenate(self.labels) if self.labels else np.zeros(0, np.int64)
        if len(ids) != n:
            out.append(f"{len(ids)} samples, {n} written")
        elif not np.array_equal(np.sort(ids), np.arange(n, dtype=np.uint64)):
            out.append(f"not every record exactly once ({len(np.unique(ids))} distinct of {n})")
        if len(labels) == len(ids) and len(ids) and not np.array_equal(labels, (ids % LABELS).astype(np.int64)):
            out.append("labels do not match their records")
        if self.tail != self.expect["tail_sum"]:
            out.append("payload tail checksum differs")
        if self.bytes != n * self.expect["size"]:
            out.append(f"{self.bytes} payload bytes, {n * self.expect['size']} written")
        return out

    def order_head(self, k: int = 8) -> list[int]:
        """The first k delivered indices (shows that the order is shuffled)."""
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.uint64)
        return [int(x) for x in ids[:k]]
