"""Standard attention in three kernels: the IO-bound baseline of chapter 9.4.1.

What it computes
    The textbook attention, one kernel per step, every intermediate going through global memory:

        1. S = Q K^T * scale        scores kernel    writes S, (B, Hq, Sq, Sk) float32
        2. P = softmax(S) by rows   softmax kernel   reads S, writes P over it, and lse
        3. O = P V                  output kernel    reads P, writes O

    It exists to be measured against the fused kernels (bench/io_bytes.py and
    bench/bench_attention.py): same inputs, same outputs ``(out, lse)`` as ``flash_attn_fwd``, but
    the N x N matrix makes the round trip to memory that FlashAttention avoids.

Memory traffic
    Theta(N d + N^2) per (batch, head): Q, K, V and O cross once each (the N d term), and the
    N x N matrix four times: S written, S read, P written, P read. S and P are float32, so the
    N^2 term is 16 N^2 bytes; at d = 64 in 16-bit storage it is larger than the N d term
    (4 * 2 N d bytes) from N = 32 on. (The softmax kernel reads its row of S twice; the second
    read finds it in cache.)

Grid / block mapping
    scores  grid (ceil(Sk / 64), ceil(Sq / 64) * B * Hq), block 256 = 16 x 16 threads: a tiled
            matrix product. Each 64 x 64 tile of S is accumulated in registers over the head
            dimension, 16 columns of Q and K at a time staged in shared memory (transposed, so
            each step of the product reads one row of each tile). Thread (ty, tx) owns the 4 x 4
            outputs at rows ty + 16 i and columns tx + 16 j: a warp's shared reads hit 16
            consecutive words (no bank conflict) and its global writes are contiguous.
    softmax grid (Sq, B * Hq), block 128: one row of S per block. Pass 1: each thread runs the
            online softmax of chapter 9.4.2 over its strided columns (a running maximum m and a
            sum l rescaled whenever m grows); the 128 pairs (m, l) are then merged in shared
            memory by a tree with the same rescaling rule. Pass 2 writes P = exp(S - m) / l.
    output  grid (ceil(D / 64), ceil(Sq / 64) * B * Hq), block 256: the same tiled product with
            the reduction running over the Sk columns of P, 16 at a time.
    The y rows fold into y and z past 65535 (common/grid.py).

Shared memory
    2 x 16 x 65 float32 words (8.1 KiB, static) per product block; 2 x 128 words per softmax
    block. No dynamic shared memory, no opt-in.

Causal (bottom-right aligned, query i sees keys j <= i + Sk - Sq)
    The softmax kernel applies the mask (P = 0 past the diagonal) and the two products still do
    the full N^2 work, as the three-step attention does. Rows with no visible key give
    ``out = 0`` and ``lse = +inf``.

Limits
    Needs B * Hq * Sq * Sk * 4 bytes of scratch for S / P. Head dims and lengths as the flash
    kernels (any Sq, Sk; D a multiple of 8 up to 256; GQA; strides other than the last
    honoured); float32 accumulation for float16 / bfloat16 (uint16 bits) / float32 storage.
    Differs from the reference only by float32 rounding.
"""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, types

from ..runtime.arrays import FLOAT_FORMATS
from ..runtime.launcher import cdiv
from ..runtime.spec import KernelSpec, Sample, Tiles
from .common.grid import fold, folded_row

from .common import constants, formats

TILE = 64            # rows and columns of one tile of S (or of O) per product block
STEP = 16            # reduction columns staged in shared memory per step of a product
MICRO = 4            # each thread owns MICRO x MICRO outputs of its tile
SIDE = TILE // MICRO  # 16 threads along each side of a product block
GEMM_THREADS = SIDE * SIDE
SOFTMAX_THREADS = 128
PAD = TILE + 1       # shared row stride: the transposing writes then spread over the banks


@lru_cache(maxsize=None)
def _make_product_step():
    """acc[i, j] += sum_t A_s[t, ty + 16 i] * B_s[t, tx + 16 j] over one staged step."""

    @cuda.jit(device=True, inline="always")
    def product_step(a_s, b_s, acc, ty, tx):
        b_row = cuda.local.array(MICRO, float32)
        for t in range(STEP):
            for j in range(MICRO):
                b_row[j] = b_s[t, tx + SIDE * j]
            for i in range(MICRO):
                a = a_s[t, ty + SIDE * i]
                for j in range(MICRO):
                    acc[i, j] += a * b_row[j]

    return product_step


@lru_cache(maxsize=None)
def make_scores_kernel(FMT):
    """Kernel 1: S[b, h] = Q[b, :, h] K[b, :, h // group]^T * scale, written in full."""
    load = formats.loader(FMT)
    product_step = _make_product_step()
    ZERO = float32(0.0)

    def naive_scores(q, k, s, seqlen_q, seqlen_k, n_heads_q, group, scale):
        q_s = cuda.shared.array((STEP, PAD), float32)  # Q tile, transposed: q_s[d, row]
        k_s = cuda.shared.array((STEP, PAD), float32)  # K tile, transposed: k_s[d, col]
        acc = cuda.local.array((MICRO, MICRO), float32)
        tid = cuda.threadIdx.x
        tx = tid % SIDE
        ty = tid // SIDE
        m_tiles = (seqlen_q + TILE - 1) // TILE
        row = folded_row()  # (batch, head, query tile), query tiles fastest
        if row >= m_tiles * q.shape[0] * n_heads_q:
            return  # past the last row: see common/grid.py
        bh = row // m_tiles
        n0 = cuda.blockIdx.x * TILE
        m0 = (row - bh * m_tiles) * TILE
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group
        head_dim = q.shape[3]
        for i in range(MICRO):
            for j in range(MICRO):
                acc[i, j] = ZERO

        for d0 in range(0, head_dim, STEP):
            # 16 columns of Q and of K -> shared; consecutive threads read consecutive d.
            for idx in range(tid, TILE * STEP, GEMM_THREADS):
                r = idx // STEP
                t = idx - r * STEP
                qx = ZERO
                kx = ZERO
                if d0 + t < head_dim:
                    if m0 + r < seqlen_q:
                        qx = load(q[b, m0 + r, h, d0 + t])
                    if n0 + r < seqlen_k:
                        kx = load(k[b, n0 + r, hk, d0 + t])
                q_s[t, r] = qx
                k_s[t, r] = kx
            cuda.syncthreads()
            product_step(q_s, k_s, acc, ty, tx)
            cuda.syncthreads()  # the tiles are overwritten by the next step

        for i in range(MICRO):
            r = m0 + ty + SIDE * i
            if r < seqlen_q:
                for j in range(MICRO):
                    c = n0 + tx + SIDE * j
                    if c < seqlen_k:
                        s[b, h, r, c] = acc[i, j] * scale

    return naive_scores


@lru_cache(maxsize=None)
def make_softmax_kernel(CAUSAL):
    """Kernel 2: P = softmax(S) row by row, in place, and lse (natural log)."""
    LOG2E, NEG_INF, POS_INF = constants.LOG2E, constants.NEG_INF, constants.POS_INF
    ZERO, ONE = float32(0.0), float32(1.0)
    LEVELS = int(math.log2(SOFTMAX_THREADS))
    assert 1 << LEVELS == SOFTMAX_THREADS

    def naive_softmax(s, lse, seqlen_q, seqlen_k):
        m_s = cuda.shared.array(SOFTMAX_THREADS, float32)
        l_s = cuda.shared.array(SOFTMAX_THREADS, float32)
        tid = cuda.threadIdx.x
        bh = folded_row()
        if bh >= s.shape[0] * s.shape[1]:
            return  # past the last (batch, head): see common/grid.py
        r = cuda.blockIdx.x
        b = bh // s.shape[1]
        h = bh - b * s.shape[1]
        visible = seqlen_k  # this row sees keys 0 .. visible - 1
        if CAUSAL:
            visible = max(min(seqlen_k, r + seqlen_k - seqlen_q + 1), 0)

        # Pass 1: online softmax over this thread's columns.
        m_i = NEG_INF
        l_i = ZERO
        for c in range(tid, visible, SOFTMAX_THREADS):
            x = s[b, h, r, c]
            m_new = max(m_i, x)
            l_i = l_i * math.exp2((m_i - m_new) * LOG2E) + math.exp2((x - m_new) * LOG2E)
            m_i = m_new

        # Merge the per-thread (m, l) pairs: l_a e^(m_a - m) + l_b e^(m_b - m), m = max(m_a, m_b).
        m_s[tid] = m_i
        l_s[tid] = l_i
        cuda.syncthreads()
        for level in range(LEVELS):
            half = SOFTMAX_THREADS >> (level + 1)
            if tid < half:
                m_a = m_s[tid]
                m_b = m_s[tid + half]
                m_new = max(m_a, m_b)
                if m_new != NEG_INF:  # both empty: keep (-inf, 0)
                    l_s[tid] = (l_s[tid] * math.exp2((m_a - m_new) * LOG2E)
                                + l_s[tid + half] * math.exp2((m_b - m_new) * LOG2E))
                    m_s[tid] = m_new
            cuda.syncthreads()
        m = m_s[0]
        l = l_s[0]

        # Pass 2: P over S; masked and empty rows get 0.
        inv = ONE / l if l > ZERO else ZERO
        for c in range(tid, seqlen_k, SOFTMAX_THREADS):
            p = ZERO
            if c < visible:
                p = math.exp2((s[b, h, r, c] - m) * LOG2E) * inv
            s[b, h, r, c] = p
        if tid == 0:
            lse[b, h, r] = m + math.log(l) if l > ZERO else POS_INF

    return naive_softmax


@lru_cache(maxsize=None)
def make_output_kernel(FMT):
    """Kernel 3: O[b, :, h] = P[b, h] V[b, :, h // group]."""
    load, store = formats.loader(FMT), formats.storer(FMT)
    product_step = _make_product_step()
    ZERO = float32(0.0)

    def naive_output(p, v, out, seqlen_q, seqlen_k, n_heads_q, group):
        p_s = cuda.shared.array((STEP, PAD), float32)  # P tile, transposed: p_s[key, row]
        v_s = cuda.shared.array((STEP, PAD), float32)  # V tile: v_s[key, d]
        acc = cuda.local.array((MICRO, MICRO), float32)
        tid = cuda.threadIdx.x
        tx = tid % SIDE
        ty = tid // SIDE
        m_tiles = (seqlen_q + TILE - 1) // TILE
        row = folded_row()  # (batch, head, query tile), query tiles fastest
        if row >= m_tiles * out.shape[0] * n_heads_q:
            return  # past the last row: see common/grid.py
        bh = row // m_tiles
        c0 = cuda.blockIdx.x * TILE
        m0 = (row - bh * m_tiles) * TILE
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group
        head_dim = v.shape[3]
        for i in range(MICRO):
            for j in range(MICRO):
                acc[i, j] = ZERO

        for k0 in range(0, seqlen_k, STEP):
            for idx in range(tid, TILE * STEP, GEMM_THREADS):
                # P: consecutive threads read consecutive keys of a row.
                r = idx // STEP
                t = idx - r * STEP
                px = ZERO
                if m0 + r < seqlen_q and k0 + t < seqlen_k:
                    px = p[b, h, m0 + r, k0 + t]
                p_s[t, r] = px
                # V: consecutive threads read consecutive d of a key.
                t = idx // TILE
                c = idx - t * TILE
                vx = ZERO
                if k0 + t < seqlen_k and c0 + c < head_dim:
                    vx = load(v[b, k0 + t, hk, c0 + c])
                v_s[t, c] = vx
            cuda.syncthreads()
            product_step(p_s, v_s, acc, ty, tx)
            cuda.syncthreads()

        for i in range(MICRO):
            r = m0 + ty + SIDE * i
            if r < seqlen_q:
                for j in range(MICRO):
                    c = c0 + tx + SIDE * j
                    if c < head_dim:
                        out[b, r, h, c] = store(acc[i, j])

    return naive_output


# ----------------------------------------------------------------------------- specs

class Config(NamedTuple):
    causal: bool
    fmt: str


class _Spec(KernelSpec):
    """The three kernels' tiles are fixed by their thread mapping; shared memory is static.
    Problem: q, k, v, scores (B, Hq, Sq, Sk) float32, out, lse, scale."""

    Config = Config

    def config(self, problem):
        return Config(problem.causal, problem.fmt)

    def entry(self, config, device):
        return TILE

    def tiles(self, config, entry):
        return Tiles(entry, entry, GEMM_THREADS, 0)

    def samples(self):
        return [Sample(f"{self.name.replace('_', ' ')} {fmt}", (False, fmt))
                for fmt in FLOAT_FORMATS]

    @staticmethod
    def sizes(p):
        q, k = p["q"], p["k"]
        return (np.int32(q.shape[1]), np.int32(k.shape[1]), np.int32(q.shape[2]),
                np.int32(q.shape[2] // k.shape[2]))


class Scores(_Spec):
    """S = Q K^T * scale: (q, k, s, Sq, Sk, Hq, group, scale); grid (Sk, Sq * B * Hq) in tiles."""

    name = "naive_scores"

    def code_key(self, config, tiles):
        return config.fmt

    def make(self, config, tiles):
        return make_scores_kernel(config.fmt)

    def signature(self, config):
        t = types.Array(formats.storage_type(config.fmt), 4, "A")
        f4 = types.Array(types.float32, 4, "A")
        i32 = types.int32
        return types.void(t, t, f4, i32, i32, i32, i32, types.float32)

    def grid(self, config, tiles, p):
        b, sq, hq, _ = p["q"].shape
        return (cdiv(p["k"].shape[1], TILE), *fold(cdiv(sq, TILE) * b * hq))

    def arguments(self, config, p):
        return (p["q"], p["k"], p["scores"], *self.sizes(p), np.float32(p["scale"]))


class Softmax(_Spec):
    """P = softmax(S) in place, lse: (s, lse, Sq, Sk); grid (Sq, B * Hq), a block per row."""

    name = "naive_softmax"

    def tiles(self, config, entry):
        return Tiles(1, 0, SOFTMAX_THREADS, 0)

    def code_key(self, config, tiles):
        return config.causal

    def samples(self):
        return [Sample(f"naive softmax causal={causal}", (causal, "float32"))
                for causal in (False, True)]

    def make(self, config, tiles):
        return make_softmax_kernel(config.causal)

    def signature(self, config):
        f4, f3 = types.Array(types.float32, 4, "A"), types.Array(types.float32, 3, "A")
        return types.void(f4, f3, types.int32, types.int32)

    def grid(self, config, tiles, p):
        b, sq, hq, _ = p["q"].shape
        return (sq, *fold(b * hq))

    def arguments(self, config, p):
        return p["scores"], p["lse"], np.int32(p["q"].shape[1]), np.int32(p["k"].shape[1])


class Output(_Spec):
    """O = P V: (p, v, out, Sq, Sk, Hq, group); grid (D, Sq * B * Hq) in tiles."""

    name = "naive_output"

    def code_key(self, config, tiles):
        return config.fmt

    def make(self, config, tiles):
        return make_output_kernel(config.fmt)

    def signature(self, config):
        t = types.Array(formats.storage_type(config.fmt), 4, "A")
        f4 = types.Array(types.float32, 4, "A")
        i32 = types.int32
        return types.void(f4, t, t, i32, i32, i32, i32)

    def grid(self, config, tiles, p):
        b, sq, hq, d = p["q"].shape
        return (cdiv(d, TILE), *fold(cdiv(sq, TILE) * b * hq))

    def arguments(self, config, p):
        return (p["scores"], p["v"], p["out"], *self.sizes(p))


SCORES, SOFTMAX, OUTPUT = Scores(), Softmax(), Output()
