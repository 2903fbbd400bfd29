"""Pure-Python statement of dataset-rt 0.4.8's shuffle RNG (rand 0.8 + rand_chacha).

This module is the executable statement of the documented algorithm, for tests only: it is slow
(pure Python, one ChaCha8 block per draw) and exists so that ``datasetrt._native.draws`` can be
checked bit for bit. It was verified against the real dataset-rt 0.4.8 package.

* draw ``d`` (a global u64 index) uses a fresh ``ChaCha8Rng::seed_from_u64(seed ^ rotl64(d, 32))``;
* ``seed_from_u64`` runs 8 PCG32 steps whose outputs are the 8 ChaCha key words, in order;
* ChaCha8 = 4 double rounds; 64-bit block counter (from 0) in words 12/13, stream 0 in 14/15;
  output words are consumed in order and ``next_u64 = lo | hi << 32``;
* uniform: rand 0.8 ``UniformInt<u64>::sample_single(0..n)`` (widening multiply, rejection zone);
* weighted: rand 0.8 ``WeightedIndex<f64>`` (``UniformFloat(0, total)`` then ``bisect_right`` over
  the n-1 leading cumulative sums).
"""

import bisect
import struct

M32 = 0xFFFF_FFFF
M64 = (1 << 64) - 1

_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
_PCG_MUL = 6364136223846793005
_PCG_INC = 11634580027462260723
_ONE_MINUS_EPS = 1.0 - 2.0**-52


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def _quarter_round(s: list[int], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & M32
    s[d] = _rotl32(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotl32(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & M32
    s[d] = _rotl32(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotl32(s[b] ^ s[c], 7)


def chacha8_block(key: list[int], counter: int) -> list[int]:
    """The 16 output words of ChaCha8 for ``key`` (8 words) at block ``counter``, stream 0."""
    init = [*_CONSTANTS, *key, counter & M32, counter >> 32, 0, 0]
    s = init[:]
    for _ in range(4):  # 4 double rounds = 8 rounds
        _quarter_round(s, 0, 4, 8, 12)
        _quarter_round(s, 1, 5, 9, 13)
        _quarter_round(s, 2, 6, 10, 14)
        _quarter_round(s, 3, 7, 11, 15)
        _quarter_round(s, 0, 5, 10, 15)
        _quarter_round(s, 1, 6, 11, 12)
        _quarter_round(s, 2, 7, 8, 13)
        _quarter_round(s, 3, 4, 9, 14)
    return [(x + y) & M32 for x, y in zip(s, init)]


def seed_key(state: int) -> list[int]:
    """rand_core ``seed_from_u64``: the 8 PCG32 outputs that form the ChaCha key."""
    key = []
    for _ in range(8):
        state = (state * _PCG_MUL + _PCG_INC) & M64
        xs = (((state >> 18) ^ state) >> 27) & M32
        rot = state >> 59
        key.append(((xs >> rot) | (xs << ((32 - rot) & 31))) & M32)
    return key


class DrawRng:
    """``ChaCha8Rng::seed_from_u64(state)``, reading output words in order."""

    def __init__(self, state: int) -> None:
        self.key = seed_key(state)
        self.counter = 0
        self.words: list[int] = []
        self.pos = 0

    def next_u32(self) -> int:
        if self.pos == len(self.words):
            self.words = chacha8_block(self.key, self.counter)
            self.counter += 1
            self.pos = 0
        word = self.words[self.pos]
        self.pos += 1
        return word

    def next_u64(self) -> int:
        lo = self.next_u32()
        return (self.next_u32() << 32) | lo


def draw_rng(seed: int, d: int) -> DrawRng:
    """The fresh generator for global draw index ``d``: seed ^ rotl64(d, 32)."""
    d &= M64
    return DrawRng(seed ^ (((d << 32) | (d >> 32)) & M64))


def gen_range(rng: DrawRng, n: int) -> int:
    """rand 0.8 ``UniformInt<u64>::sample_single(0..n)``, n >= 1."""
    zone = ((n << (64 - n.bit_length())) & M64) - 1
    while True:
        m = rng.next_u64() * n
        if m & M64 <= zone:
            return m >> 64


def _f64_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _f64_to_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def cumulative(weights: list[float]) -> tuple[list[float], float]:
    """``WeightedIndex<f64>`` tables: the n-1 leading running sums and the sampler's scale."""
    cum, total = [], weights[0]
    for w in weights[1:]:
        cum.append(total)
        total += w
    scale = total
    while scale * _ONE_MINUS_EPS >= total:
        scale = _f64_from_bits(_f64_to_bits(scale) - 1)
    return cum, scale


def weighted(rng: DrawRng, cum: list[float], scale: float) -> int:
    """One ``WeightedIndex<f64>`` sample: u in [0, 1) from the top 52 bits, times scale, bisect."""
    u = _f64_from_bits((rng.next_u64() >> 12) | (1023 << 52)) - 1.0
    return bisect.bisect_right(cum, u * scale)


def uniform_draws(seed: int, n: int, start: int, count: int) -> list[int]:
    return [gen_range(draw_rng(seed, d), n) for d in range(start, start + count)]


def weighted_draws(seed: int, weights: list[float], start: int, count: int) -> list[int]:
    cum, scale = cumulative(weights)
    return [weighted(draw_rng(seed, d), cum, scale) for d in range(start, start + count)]


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def derive_seed(common: int, rank: int, worker: int) -> int:
    """dataset-rt's per-(rank, worker) seed (SplitMix64 finaliser, no gamma increment)."""
    key = _mix(common ^ 0x4453545253454544)
    return _mix(((rank << 32) | worker) ^ key)
