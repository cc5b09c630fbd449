"""FP8 quantization with per-(batch, head) scales (``quantize_fp8``): what FP8 attention and FP8
KV caches are fed.

What it computes
    float8_e4m3fn keeps 3 mantissa bits and a range of +-448, so a tensor is stored scaled:
    ``x_fp8 = round(x / descale)`` with one ``descale`` per (batch, head), the number a stored
    value is multiplied by to get x back (FlashAttention-3's convention, float32 ``(B, H)``).
    The scale that uses the whole range without saturating is ``descale = amax / 448``, amax
    the largest |x| of that (batch, head); a (batch, head) of zeros gets descale 1. Values are
    multiplied by ``inv = 1 / descale`` (one IEEE division per CTA) and rounded to the nearest
    even e4m3, saturating at +-448 (``cvt.rn.satfinite``): ``amax * inv`` may round a hair
    above 448, and a caller's descale may be too small for its data.

Two kernels, because the scale depends on every element of a (batch, head) and the elements
are spread over many CTAs
    1. ``amax_simt``: grid (B * H, SPLITS); CTA (bh, split) reduces |x| over its ``rows``
       sequence positions of (b, h) (each thread a strided run of the rows' ``rows * D``
       elements, then a tree in shared memory) to one float32 in ``partial[bh, split]``. No
       atomics: the maxima are reduced again by the second kernel, so the result does not
       depend on the order CTAs finish in, and nothing needs zeroing first.
    2. ``quantize_simt``: the same grid; every CTA of (b, h) reduces the SPLITS maxima of
       ``partial[bh]`` itself (the same values in the same order: every CTA gets the same
       descale), CTA split 0 writes ``descale[b, h]``, and each CTA scales and rounds its rows.
       With ``GIVEN`` (a caller's descale) the first kernel does not run and this one reads
       ``descale[b, h]``.

Grid / block mapping
    THREADS = 256 threads per CTA; SPLITS = ceil(S / rows), ``rows`` chosen on the host so that
    SPLITS fits the grid's y limit (``split_rows``); the last split may hold fewer rows.

Shared memory
    THREADS float32 (1 KiB), static, for the tree reductions.

Limits
    x float16, bfloat16 or float32, (B, S, H, D) with any strides but a contiguous last
    dimension; out float8_e4m3fn of the same shape. The e4m3 conversion instructions need
    sm_89 or later. Infinities in x give an infinite descale; NaNs are skipped by the maximum
    and stay NaN.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, types

from ...runtime.spec import SM90, KernelSpec, Sample, Tiles
from ..attention import I32
from ..common.formats import loader, storage_type, storer
from ..instructions import convert

THREADS = 256
E4M3_MAX = 448.0   # the largest finite float8_e4m3fn
MAX_SPLITS = 65535  # grid.y


def split_rows(seqlen):
    """``(rows, splits)``: sequence positions per CTA and CTAs per (batch, head): 32 rows per
    CTA (enough elements to amortize its reduction), more where S would need more than
    MAX_SPLITS CTAs."""
    rows = max(32, -(-seqlen // MAX_SPLITS))
    return rows, -(-seqlen // rows)


@cuda.jit(device=True, inline="always")
def block_max(acc, tid, m):
    """The maximum of ``m`` over the CTA's THREADS threads, through ``acc`` (THREADS float32 of
    shared memory): halves of the array fold onto each other, log2(THREADS) steps."""
    acc[tid] = m
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if tid < half and acc[tid + half] > acc[tid]:
            acc[tid] = acc[tid + half]
        cuda.syncthreads()
        half //= 2
    m = acc[0]
    cuda.syncthreads()  # acc is free again once every thread has read the result
    return m


class Config(NamedTuple):
    fmt: str            # x's format
    given: bool = False  # the caller's descale (quantize_simt only)


@lru_cache(maxsize=None)
def make_amax_kernel(FMT):
    load = loader(FMT)
    ZERO = float32(0.0)

    def amax_simt(x, partial, rows):
        acc = cuda.shared.array(THREADS, float32)
        tid = cuda.threadIdx.x
        bh, split = cuda.blockIdx.x, cuda.blockIdx.y
        seqlen, heads, head_dim = x.shape[1], x.shape[2], x.shape[3]
        b, h = bh // heads, bh % heads
        s0 = split * rows
        n = min(rows, seqlen - s0) * head_dim
        m = ZERO
        for i in range(tid, n, THREADS):
            v = abs(load(x[b, s0 + i // head_dim, h, i % head_dim]))
            if v > m:  # (False for NaN: NaNs are skipped)
                m = v
        m = block_max(acc, tid, m)
        if tid == 0:
            partial[bh, split] = m

    return amax_simt


@lru_cache(maxsize=None)
def make_quantize_kernel(FMT, GIVEN):
    load, store = loader(FMT), storer("float8_e4m3fn")
    ZERO, ONE, MAX = float32(0.0), float32(1.0), float32(E4M3_MAX)

    def quantize_simt(x, out, partial, descale, rows):
        acc = cuda.shared.array(THREADS, float32)
        tid = cuda.threadIdx.x
        bh, split = cuda.blockIdx.x, cuda.blockIdx.y
        seqlen, heads, head_dim = x.shape[1], x.shape[2], x.shape[3]
        b, h = bh // heads, bh % heads
        if GIVEN:
            d = descale[b, h]
        else:
            m = ZERO
            for j in range(tid, partial.shape[1], THREADS):
                if partial[bh, j] > m:
                    m = partial[bh, j]
            m = block_max(acc, tid, m)
            d = convert.div_rn(m, MAX) if m > ZERO else ONE  # IEEE division (fastmath's is not)
            if split == 0 and tid == 0:
                descale[b, h] = d
        inv = convert.div_rn(ONE, d)
        s0 = split * rows
        n = min(rows, seqlen - s0) * head_dim
        for i in range(tid, n, THREADS):
            s, c = s0 + i // head_dim, i % head_dim
            out[b, s, h, c] = store(load(x[b, s, h, c]) * inv)

    return quantize_simt


class _Spec(KernelSpec):
    Config = Config

    def entry(self, config, device):
        return THREADS

    def tiles(self, config, entry):
        return Tiles(1, 1, entry, 0)

    def grid(self, config, tiles, p):
        b, _, h, _ = p["x"].shape
        return (b * h, p["splits"])


class Amax(_Spec):
    """(x, partial, rows); problem: x (B, S, H, D), partial (B * H, SPLITS) float32, rows and
    splits (``split_rows``)."""

    name = "amax_simt"

    def config(self, problem):
        return Config(problem["x"].fmt)

    def make(self, config, tiles):
        return make_amax_kernel(config.fmt)

    def signature(self, config):
        return types.void(types.Array(storage_type(config.fmt), 4, "A"),
                          types.Array(types.float32, 2, "A"), I32)

    def arguments(self, config, p):
        return p["x"], p["partial"], np.int32(p["rows"])

    def samples(self):
        return [Sample(f"simt amax {fmt}", (fmt,), ccs=(SM90,)) for fmt in ("bfloat16",)]


class Quantize(_Spec):
    """(x, out, partial, descale, rows); problem: x, out (B, S, H, D), partial as ``Amax``'s
    (a placeholder with ``GIVEN``), descale (B, H) float32, rows and splits."""

    name = "quantize_simt"

    def config(self, problem):
        return Config(problem["x"].fmt, problem["given"])

    def make(self, config, tiles):
        return make_quantize_kernel(config.fmt, config.given)

    def signature(self, config):
        f32_2d = types.Array(types.float32, 2, "A")
        return types.void(types.Array(storage_type(config.fmt), 4, "A"),
                          types.Array(types.uint8, 4, "A"), f32_2d, f32_2d, I32)

    def arguments(self, config, p):
        return p["x"], p["out"], p["partial"], p["descale"], np.int32(p["rows"])

    def samples(self):
        return [Sample(f"simt quantize {fmt} given={given}", (fmt, given), ccs=(SM90,))
                for fmt, given in (("bfloat16", False), ("float16", True), ("float32", False))]


AMAX, QUANTIZE = Amax(), Quantize()
