"""FlashAttention forward, one thread per query row: the smallest kernel that is still "flash".

A teaching kernel (docs/tutorial/03-minimal-flash.md). It computes what ``simt/forward.py``
computes, with the same arguments and grid, in the plainest way that keeps the N x N matrix out of
global memory. ``backend="auto"`` never picks it and the public API does not offer it: launch it
through ``SPEC``, as ``run`` below does.

What it computes
    Thread ``t`` of a block owns query row ``r = m0 + t`` of one (batch, query head), with
    ``m0 = blockIdx.x * BLOCK_M``. The block streams the key/value tiles ``K_j, V_j`` (BLOCK_N
    rows each) through shared memory; for every tile each thread updates its row's online-softmax
    state, which lives in registers:

        s_c   = q_r . k_c * scale        c = 0 .. BLOCK_N - 1 (one dot product per key)
        m_new = max(m_i, max_c s_c)
        alpha = exp(m_i - m_new)         how much the old state shrinks
        l_i   = l_i * alpha + sum_c exp(s_c - m_new)
        O_i   = O_i * alpha + sum_c exp(s_c - m_new) v_c
        m_i   = m_new
    and at the end writes ``O_i / l_i`` and ``lse = m_i + log(l_i)``. As in the other forwards,
    Q is pre-multiplied by ``scale * log2(e)`` so each exponential is one ``exp2``.

Grid / block mapping
    grid = (ceil(Sq / BLOCK_M), B * Hq), the B * Hq rows folded into y and z past 65535
    (``common/grid.py``); block = BLOCK_M = 128 threads, one per query row. Query head ``h``
    reads kv head ``h // (Hq // Hk)`` (GQA/MQA). Every thread takes part in loading each tile
    (consecutive threads read consecutive elements of a row: coalesced), then waits at a
    ``syncthreads`` before anyone reads it, and again before the next tile overwrites it.

Shared memory (float32 words, dynamic)
    Q    BLOCK_M x (HEAD_DIM + 1)   each thread reads only its own row; the +1 puts the 32 rows
                                    a warp reads at one time on 32 different banks
    K    BLOCK_N x HEAD_DIM         all threads read the same word at the same time: a broadcast,
    V    BLOCK_N x HEAD_DIM         no bank conflict
    S    BLOCK_M x (BLOCK_N + 1)    the row's scores of the tile, between the max and the sum;
                                    padded like Q
    e.g. 66 KiB at HEAD_DIM = 64 (BLOCK_N = 32), above the 48 KiB static limit (the launcher
    opts in). Scores and Q stay in shared memory rather than registers because a thread's
    registers hold O_i (HEAD_DIM floats) already: with Q_i or a tile of scores beside it the
    kernel would spill at HEAD_DIM = 128.

Why it is slow
    Every score costs HEAD_DIM shared-memory reads of K and of Q for HEAD_DIM multiply-adds, and
    every P V term one read of V per multiply-add: one shared word per FLOP pair, where the
    register micro-tiles of ``simt/forward.py`` reuse each word several times. A warp's output
    stores touch 32 different rows. Causal attention skips the key tiles past the diagonal of the
    block's last row (``common/masks.py``) and masks the rest key by key.

Limits
    HEAD_DIM a multiple of 8 up to 128 (O_i, HEAD_DIM float32, lives in one thread's
    registers); any Sq, Sk; strides other than the last
    honoured; float32 accumulation for float16 / bfloat16 (uint16 bits) / float32 storage. Rows
    with no visible key get ``out = 0`` and ``lse = +inf``. Dense batches only (it takes the
    varlen arguments of every forward kernel, kernels/attention.py, and reads none of them).
"""

import math
from functools import lru_cache

from numba import cuda, float32

from ...runtime import arrays, device, status
from ...runtime.spec import Tiles
from ..attention import ForwardSpec, sample
from ..common import constants, formats
from ..common.epilogue import lse_of
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import make_kv_end, make_mask, make_seqlen_info
from .tiles import THREADS, make_tile_loader

BLOCK_M = THREADS  # one thread per query row (make_tile_loader strides by THREADS)
MAX_HEAD_DIM = 128


def strides(BLOCK_N, HEAD_DIM):
    """Row strides (float32 words) of the shared Q and score tiles."""
    return HEAD_DIM + 1, BLOCK_N + 1


def shared_layout(BLOCK_N, HEAD_DIM):
    """The Q, K, V and score tiles, in float32 words (the module's "Shared memory")."""
    q_stride, s_stride = strides(BLOCK_N, HEAD_DIM)
    return SharedLayout(4, [("q", BLOCK_M * q_stride), ("k", BLOCK_N * HEAD_DIM),
                            ("v", BLOCK_N * HEAD_DIM), ("s", BLOCK_M * s_stride)])


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_N, CAUSAL, FMT):
    """Python kernel function specialised for one configuration (``SPEC`` compiles it)."""
    assert HEAD_DIM % 8 == 0 and HEAD_DIM <= MAX_HEAD_DIM
    lay = shared_layout(BLOCK_N, HEAD_DIM)
    Q_OFF, K_OFF, V_OFF, S_OFF = lay.q, lay.k, lay.v, lay.s
    Q_STRIDE, S_STRIDE = strides(BLOCK_N, HEAD_DIM)
    load_q = make_tile_loader(BLOCK_M, HEAD_DIM, Q_STRIDE, 1, FMT)
    seqlen_info = make_seqlen_info(False)  # dense batches only
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    masked_out = make_mask(CAUSAL, KEYS_IN_RANGE=True)  # the key loop stops at the last key
    load, store = formats.loader(FMT), formats.storer(FMT)
    NEG_INF = constants.NEG_INF
    ZERO, ONE = float32(0.0), float32(1.0)

    def flash_fwd_rowwise(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                          cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table,
                          window_left, window_right, softcap, alibi_slopes, sink):
        smem = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = cuda.blockIdx.x * BLOCK_M
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group
        row = m0 + tid  # this thread's query row (past seqlen_q: computes on zeros, writes nothing)
        q_row = Q_OFF + tid * Q_STRIDE

        # Q_i -> shared, pre-scaled so that the scores come out in base-2 units.
        load_q(smem, Q_OFF, q, b, m0, h, seqlen_q, scale_log2, tid)

        # The row's online-softmax state: registers, never memory.
        m_i = NEG_INF
        l_i = ZERO
        O_i = cuda.local.array(HEAD_DIM, float32)
        for d in range(HEAD_DIM):
            O_i[d] = ZERO

        _, _, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        for n0 in range(0, kv_end(m0, diag, seqlen_k), BLOCK_N):
            cuda.syncthreads()  # everyone is done with the previous K_j, V_j
            for idx in range(tid, BLOCK_N * HEAD_DIM, BLOCK_M):
                c = idx // HEAD_DIM
                d = idx - c * HEAD_DIM
                kx = ZERO
                vx = ZERO
                if n0 + c < seqlen_k:
                    kx = load(k[b, n0 + c, hk, d])
                    vx = load(v[b, n0 + c, hk, d])
                smem[K_OFF + idx] = kx
                smem[V_OFF + idx] = vx
            cuda.syncthreads()  # K_j, V_j are complete

            # The row's scores against the tile's keys (in shared memory: see the module), and
            # their maximum. A run-time trip count: the loop over keys stays a loop.
            s_row = S_OFF + tid * S_STRIDE
            n_keys = min(BLOCK_N, seqlen_k - n0)
            mx = NEG_INF
            for c in range(n_keys):
                acc = ZERO
                for d in range(HEAD_DIM):
                    acc += smem[q_row + d] * smem[K_OFF + c * HEAD_DIM + d]
                if masked_out(row, n0 + c, diag, seqlen_k):
                    acc = NEG_INF
                smem[s_row + c] = acc
                mx = max(mx, acc)

            # Rescale the old state to the new maximum, then add the tile's terms.
            m_new = max(m_i, mx)
            base = m_new if m_new != NEG_INF else ZERO  # nothing visible yet: keep exp2(-inf) = 0
            alpha = math.exp2(m_i - base)
            m_i = m_new
            l_i *= alpha
            for d in range(HEAD_DIM):
                O_i[d] *= alpha
            for c in range(n_keys):
                p = math.exp2(smem[s_row + c] - base)
                l_i += p
                for d in range(HEAD_DIM):
                    O_i[d] += p * smem[V_OFF + c * HEAD_DIM + d]

        if row < seqlen_q:
            inv = ONE / l_i if l_i > ZERO else ZERO
            for d in range(HEAD_DIM):
                out[b, row, h, d] = store(O_i[d] * inv)
            lse[b, h, row] = lse_of(m_i, l_i)

    return flash_fwd_rowwise


# ----------------------------------------------------------------------------- spec

# BLOCK_N by head dim: at HEAD_DIM = 128 half the keys per tile keep the block at 90 KiB.
TILES = ((64, 32), (MAX_HEAD_DIM, 16))


class Spec(ForwardSpec):
    name = "flash_fwd_rowwise"
    unroll_loops = True  # O_i stays in registers only if every loop over it unrolls

    def entry(self, config, device):
        for limit, block_n in TILES:
            if config.head_dim <= limit:
                return block_n
        raise ValueError(f"{self.name}: head_dim {config.head_dim} > {MAX_HEAD_DIM}")

    def tiles(self, config, entry):
        return Tiles(BLOCK_M, entry, BLOCK_M, shared_layout(entry, config.head_dim).bytes)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_N, config.causal, config.fmt)

    def samples(self):
        return [sample("simt rowwise fwd", (d, causal, "float16")) for d in (8, 64, 128)
                for causal in (False, True)]


SPEC = Spec()


def run(q, k, v, causal=False, softmax_scale=None, out=None):
    """``(out, lse)`` of this kernel for q (B, Sq, Hq, D), k, v (B, Sk, Hk, D) device arrays of one
    format (NumPy arrays under the simulator): the problem dict ``api.flash_attn_fwd`` builds,
    without its checks of shapes, formats and views (``out=`` takes a buffer shaped like q)."""
    q, k, v = (arrays.adapt(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    b, sq, hq, d = q.shape
    o = arrays.empty(q, q.shape, q.fmt, "out") if out is None else arrays.adapt(out, "out")
    lse = arrays.empty(q, (b, hq, sq), "float32", "lse")
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    problem = dict(q=q, k=k, v=v, out=o, lse=lse, scale=scale, status=status.word(q))
    SPEC.launch(SPEC.Config(d, bool(causal), q.fmt), problem, arrays.stream_of(q), device.current())
    return o.obj, lse.obj
