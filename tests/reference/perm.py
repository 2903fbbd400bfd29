"""Pure-Python statement of datasetrt's exactly-once orders and mixture interleave (for tests only).

The kernel `datasetrt._native.perm` and the planners in `datasetrt.sampling` are checked against
this module bit for bit. It is deliberately naive: one Python call per position, sequential
simulation of the interleave and of curricula, Fractions for the quota bound.
"""

from __future__ import annotations

import bisect

M64 = (1 << 64) - 1
ROUNDS = 6
PERM_DOMAIN = 0x4453545250455244  # b"DSTRPERD"
STREAM_DOMAIN = 0x445354525354524D  # b"DSTRSTRM"
GOLDEN = 0x9E3779B97F4A7C15


def mix(z: int) -> int:
    """SplitMix64 finaliser (no increment), mod 2**64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def permutation_key(seed: int, label: int, epoch: int) -> int:
    return mix(epoch ^ mix(label ^ mix(seed ^ PERM_DOMAIN)))


def stream_seed(seed: int, label: int) -> int:
    return mix(label ^ mix(seed ^ STREAM_DOMAIN))


def permute(key: int, n: int, x: int) -> int:
    """Image of x in [0, n) under the cycle-walked Feistel permutation keyed by `key`."""
    bits = (n - 1).bit_length()
    lo_bits = bits // 2
    lo_mask, hi_mask = (1 << lo_bits) - 1, (1 << (bits - lo_bits)) - 1
    keys = [mix(key ^ (((r + 1) * GOLDEN) & M64)) for r in range(ROUNDS)]

    def encrypt(v: int) -> int:
        lo, hi = v & lo_mask, v >> lo_bits
        for r in range(0, ROUNDS, 2):
            hi ^= mix(lo ^ keys[r]) & hi_mask
            lo ^= mix(hi ^ keys[r + 1]) & lo_mask
        return (hi << lo_bits) | lo

    x = encrypt(x)
    while x >= n:
        x = encrypt(x)
    return x


def epoch_order(seed: int, label: int, epoch: int, counts: list[int]) -> list[int]:
    """The rows of one epoch in order: row i appears counts[i] times."""
    expanded = [i for i, c in enumerate(counts) for _ in range(c)]
    key = permutation_key(seed, label, epoch)
    return [expanded[permute(key, len(expanded), t)] for t in range(len(expanded))]


def permuted(seed: int, label: int, counts: list[int], first: int, count: int) -> list[int]:
    """Positions [first, first+count) of the concatenated epochs (one key per epoch)."""
    total = sum(counts)
    out, cache = [], {}
    for p in range(first, first + count):
        epoch, t = divmod(p, total)
        if epoch not in cache:
            cache.clear()
            cache[epoch] = epoch_order(seed, label, epoch, counts)
        out.append(cache[epoch][t])
    return out


def quota_sequence(weights: list[int], steps: int) -> list[int]:
    """The quota method, simulated step by step (not periodically): stream index per step."""
    total = sum(weights)
    picked = [0] * len(weights)
    out = []
    for t in range(steps):
        best = -1
        for i, w in enumerate(weights):  # eligible: one more pick stays within the upper quota
            if w == 0 or picked[i] * total >= (t + 1) * w:
                continue
            if best < 0 or (picked[i] + 1) * weights[best] < (picked[best] + 1) * w:  # earliest deadline
                best = i
        out.append(best)
        picked[best] += 1
    return out


def bisect_rows(counts: list[int], values: list[int]) -> list[int]:
    ends, acc = [], 0
    for c in counts:
        acc += c
        ends.append(acc)
    return [bisect.bisect_right(ends, v) for v in values]


class Orders:
    """Per-stream exactly-once orders, epoch by epoch (cached), as the reference mixture reads them."""

    def __init__(self, seed: int, labels: list[int], counts: list[list[int]]):
        self.seed, self.labels, self.counts = seed, labels, counts
        self.sizes = [sum(c) for c in counts]
        self._cache: dict[tuple[int, int], list[int]] = {}

    def local(self, s: int, j: int) -> int:
        epoch, k = divmod(j, self.sizes[s])
        if (s, epoch) not in self._cache:
            self._cache[(s, epoch)] = epoch_order(self.seed, self.labels[s], epoch, self.counts[s])
        return self._cache[(s, epoch)][k]


def curriculum(
    orders: Orders,
    rows: list[list[int]],
    stages: list[dict],
    batch: int,
    total: int,
    advances: dict[int, int] | None = None,
) -> list[tuple[int, int, int]]:
    """Sequential simulation: (population row, stream, stage) of the first `total` plan positions.

    `stages`: dicts with "weights" (ints over the streams), "samples" (int or None) and "stop"
    (bool). A stage picks with the quota method from its own start; stream s continues at the
    samples it delivered before. With "stop", the stage ends just before the pick of a stream
    that has completed the epoch it was in at the stage start (rounded down to a batch boundary
    unless it is the last stage). `advances`: {position p: stage g} = advance() called at p while
    in stage g: that stage ends at the first batch boundary at or after p.
    """
    advances = advances or {}
    taken = [0] * len(rows)
    out: list[tuple[int, int, int]] = []
    for g, stage in enumerate(stages):
        start = len(out)
        left = [orders.sizes[s] - taken[s] % orders.sizes[s] for s in range(len(rows))]
        limit = stage["samples"] if stage["samples"] is not None else total - start
        for p, h in advances.items():
            if h == g:
                limit = min(limit, -(-p // batch) * batch - start)
        picks = quota_sequence(stage["weights"], max(0, min(limit, total - start)))
        count, stopped = 0, False
        in_stage = [0] * len(rows)
        for s in picks:
            if stage["stop"] and in_stage[s] == left[s]:
                stopped = True
                break
            in_stage[s] += 1
            count += 1
        if stopped and g + 1 < len(stages):
            count -= count % batch
        for s in picks[:count]:
            out.append((rows[s][orders.local(s, taken[s])], s, g))
            taken[s] += 1
        if len(out) >= total or (stopped and g + 1 == len(stages)):
            break
    return out[:total]
