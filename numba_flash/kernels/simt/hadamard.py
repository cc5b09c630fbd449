"""The random Hadamard rotation of FlashAttention-3's incoherent processing (``hadamard_rotate``).

What it computes
    FP8 attention quantizes q and k to e4m3, whose 3 mantissa bits lose most where a few
    channels of a row are much larger than the rest (outlier features): the row's scale is set
    by the outliers and the small channels round to nothing. Rotating every row by one
    orthogonal matrix M spreads each outlier over all channels, and since the same M rotates q
    and k, ``(q M)(k M)^T = q k^T``: the scores are unchanged, the quantization error is not.
    M = diag(signs) H / sqrt(n): random signs (fixed by ``seed``, so q and k get the same ones),
    then the Walsh-Hadamard matrix H of size n, over blocks of n columns (n the largest power of
    two dividing the head dim, at most 256; a head dim of 128 is one block).

    H is never formed: the fast Walsh-Hadamard transform is log2(n) butterfly stages, stage s
    pairing element i with i + 2^s within each run of 2^(s + 1) and replacing (a, b) by
    (a + b, a - b): n log2(n) additions per row instead of the n^2 multiply-adds of a matmul.

Grid / block mapping
    One warp per row of the head dim: grid = ceil(rows / WARPS), block = 32 WARPS threads, rows
    counted over (batch, sequence, head) of x (B, S, H, D). A warp loads its row into its slice
    of shared memory (lane l takes columns l, l + 32, ...), applies the signs, runs the stages
    with a ``syncwarp`` between them (each lane owns pairs p = l, l + 32, ... of a stage: column
    ``(p // half) * 2 half + p % half`` and the one ``half`` after it), scales by 1 / sqrt(n)
    and stores in x's format.

Shared memory
    WARPS x D float32, static: 8 KiB at D = 256.

Limits
    float16, bfloat16, float32; any head dim up to MAX_HEAD_DIM (an odd one is its own block of
    1: no rotation there). The signs are a hash of (seed, column): the same for every row, array
    and call with that seed.
"""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, types, uint64

from ...runtime.spec import KernelSpec, Sample, Tiles
from ..attention import I32
from ..common.formats import loader, storage_type, storer
from ..instructions import sync

WARPS = 8
MAX_HEAD_DIM = 1024
MAX_BLOCK = 256


def block_size(head_dim):
    """The rotation's block: the largest power of two dividing ``head_dim``, at most 256."""
    return min(head_dim & -head_dim, MAX_BLOCK)


def signs(head_dim, seed):
    """The rotation's signs (+1 / -1 per column) as NumPy computes them: the kernel's hash of
    (seed, column), for references and tests."""
    col = np.arange(head_dim, dtype=np.uint64)
    h = (np.uint64(seed) * np.uint64(0x9E3779B1) + col * np.uint64(0x85EBCA77)) & np.uint64(
        0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(12)
    return np.where(h & np.uint64(1), -1.0, 1.0)


class Config(NamedTuple):
    head_dim: int
    fmt: str


@lru_cache(maxsize=None)
def make_hadamard_kernel(HEAD_DIM, FMT):
    BLOCK = block_size(HEAD_DIM)
    STAGES = BLOCK.bit_length() - 1
    PAIRS = HEAD_DIM // 2
    SCALE = float32(1.0 / math.sqrt(BLOCK))
    load, store = loader(FMT), storer(FMT)
    ONE = float32(1.0)
    MASK = uint64(0xFFFFFFFF)

    @cuda.jit(device=True, inline="always")
    def sign(seed, col):
        """-1 or +1 from a 32-bit hash of (seed, column) (``signs`` is its NumPy twin)."""
        # In 64 bits, each step cut back to 32 (no product overflows: seed < 2^31, col < 2^10).
        h = (uint64(seed) * uint64(0x9E3779B1) + uint64(col) * uint64(0x85EBCA77)) & MASK
        h ^= h >> uint64(15)
        h = (h * uint64(0x2C1B3C6D)) & MASK
        h ^= h >> uint64(12)
        return -ONE if h & uint64(1) else ONE

    def hadamard_rotate_simt(x, out, seed):
        rows = cuda.shared.array((WARPS, HEAD_DIM), float32)
        tid = cuda.threadIdx.x
        w, lane = tid >> 5, tid & 31
        b_s_h = cuda.blockIdx.x * WARPS + w  # this warp's row, over (batch, sequence, head)
        n_heads, seqlen = x.shape[2], x.shape[1]
        if b_s_h >= x.shape[0] * seqlen * n_heads:
            return  # a whole warp past the last row
        b = b_s_h // (seqlen * n_heads)
        s = (b_s_h // n_heads) % seqlen
        h = b_s_h % n_heads
        v = rows[w]
        for c in range(lane, HEAD_DIM, 32):
            v[c] = load(x[b, s, h, c]) * sign(seed, c)
        for stage in range(STAGES):
            half = int32(1) << stage
            sync.syncwarp(tid)  # the last stage's writes are in
            for p in range(lane, PAIRS, 32):
                i = (p // half) * 2 * half + p % half
                a, c = v[i], v[i + half]
                v[i] = a + c
                v[i + half] = a - c
        sync.syncwarp(tid)
        for c in range(lane, HEAD_DIM, 32):
            out[b, s, h, c] = store(v[c] * SCALE)

    return hadamard_rotate_simt


class Spec(KernelSpec):
    """(x, out, seed); grid (ceil(rows / WARPS),). Problem: x and out (B, S, H, D) of one
    format, seed."""

    name = "hadamard_rotate_simt"
    Config = Config

    def config(self, problem):
        return Config(problem["x"].shape[3], problem["x"].fmt)

    def entry(self, config, device):
        return WARPS

    def tiles(self, config, entry):
        return Tiles(1, 1, 32 * entry, 0)

    def make(self, config, tiles):
        return make_hadamard_kernel(config.head_dim, config.fmt)

    def signature(self, config):
        t = types.Array(storage_type(config.fmt), 4, "A")
        return types.void(t, t, I32)

    def grid(self, config, tiles, p):
        b, s, h, _ = p["x"].shape
        return (-(-b * s * h // WARPS),)

    def arguments(self, config, p):
        return p["x"], p["out"], np.int32(p["seed"])

    def samples(self):
        return [Sample(f"simt hadamard d={d} {fmt}", (d, fmt)) for d, fmt in
                ((128, "bfloat16"), (96, "float16"), (256, "float32"))]


SPEC = Spec()
