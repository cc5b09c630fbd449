"""FlashAttention backward on CUDA cores: preprocess, then one kernel for dK/dV and one for dQ.

What it computes
    The gradients of ``O = softmax(Q K^T * scale) V`` for the incoming ``dO``, without the
    attention matrix: every tile ``P_ij`` is recomputed from Q, K and the forward's saved ``lse``
    (chapter 9.4.3, recomputation; chapter 9.4.5, the two kernels of the Triton backward):

        D_i   = rowsum(dO_i * O_i)                        preprocess, float32 (B, Hq, Sq)
        S_ij  = Q_i K_j^T * scale
        P_ij  = exp(S_ij - lse_i)                          exact softmax: lse is final
        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T
        dS_ij = P_ij * (dP_ij - D_i)                       softmax backward
        dK_j += dS_ij^T Q_i * scale
        dQ_i += dS_ij K_j * scale

    dK/dV accumulate over query tiles and dQ over key tiles: the two directions do not share a
    loop, so kernel 1 owns a KV tile and streams Q tiles, kernel 2 owns a Q tile and streams KV
    tiles, and each result is written once, by one CTA. No atomics: the order of every sum is
    fixed, so the gradients are bitwise reproducible. Exponentials run in base 2 (``S`` times
    ``scale * log2(e)``, ``lse`` times ``log2(e)``), each one ``ex2`` instruction.

Grid / block mapping (128 threads = 16 row groups x 8 lanes, as in forward.py)
    preprocess  grid (ceil(Sq / 16), B * Hq): 8 lanes per row of O, a 3-step shuffle sum.
    dK/dV       grid (ceil(Sk / BLOCK_N), B * Hk). Thread ``t`` owns kv rows
                ``(t >> 3) * TN + i`` (TN = BLOCK_N / 16) of dK_j, dV_j (columns ``(t & 7) + 8 d``)
                and of the transposed tiles S_ij^T, dP_ij^T (query columns ``(t & 7) + 8 j``).
                The CTA loops over the query heads of its kv head's group (GQA/MQA) and, for each,
                over the query tiles: the group's sum happens in registers.
    dQ          grid (ceil(Sq / BLOCK_M), B * Hq). Thread ``t`` owns query rows
                ``(t >> 3) * TM + i`` (TM = BLOCK_M / 16) of dQ_i and S_ij, dP_ij (key columns
                ``(t & 7) + 8 j``).
    dS (and P for dV) is scattered over the lanes of a row, so the second product of each step
    reads it back from shared memory, as the forward does with P.

Shared memory (float32 words, dynamic; the specs' TILES at the end)
    Q, dO, K, V tiles are row-major with a stride of HEAD_DIM + 1 words: an odd stride puts the
    column reads of the first product (8 different rows per row group) on 8 different banks,
    and the row reads of the second product (8 consecutive words) are conflict-free anyway.
    dK/dV  K_j, V_j: 2 BLOCK_N (HEAD_DIM + 1); Q_i, dO_i: 2 BLOCK_M (HEAD_DIM + 1);
           P^T, dS^T: 2 BLOCK_N (BLOCK_M + pad); lse_i, D_i: 2 BLOCK_M.
    dQ     Q_i, dO_i: 2 BLOCK_M (HEAD_DIM + 1); K_j, V_j: 2 BLOCK_N (HEAD_DIM + 1);
           dS: BLOCK_M (BLOCK_N + pad).
    e.g. 66 KiB (dK/dV, HEAD_DIM = 64), 105 KiB (dQ, HEAD_DIM = 128): above the 48 KiB static
    limit, hence the opt-in of runtime/launcher.py; below the 163 KiB of an A100.

Causal (bottom-right aligned, query i sees keys j <= i + Sk - Sq)
    Tile pairs wholly above the diagonal are skipped (kernel 1 starts at the first query tile
    that sees its keys, kernel 2 stops at the last key tile its queries see). Masks are applied
    only to tiles that cross the diagonal or the ragged end of the keys, and they set P = 0
    through integer comparisons. A row with no visible key has lse = +inf, so exp2(S - lse) = 0
    for all its keys (the compile options keep infinities, runtime/compiler.py): P = 0, hence
    dq = 0 and nothing in dk, dv. Keys past Sk are zeros in K and V but still masked: exp(0 - lse)
    overflows when lse < -88. Padded query rows are zeros in Q and dO (and get lse = D = 0), so
    they add nothing to dK, dV without a mask.

Limits
    HEAD_DIM a multiple of 8 up to 256; any Sq, Sk; strides other than the last honoured.
    Accumulation in float32; inputs float16 / bfloat16 (as uint16 bits) or float32; dq, dk, dv
    stored in the input format. D_i comes from ``out`` as stored (in the input precision), as in
    flash-attn. Against the float64 reference it differs only by rounding: float32 sums in a
    fixed order, ``ex2.approx`` on the GPU, one final rounding of dq, dk, dv.
    Dense batches, or packed varlen sequences (``VARLEN``): each CTA takes its sequence's
    rows from ``common/masks.make_seqlen_info`` and returns when its tile lies past the
    sequence's end (kernels/attention.py).

Masks and score modifiers (compile-time options, as in the forward)
    ``WINDOW``: dQ views its keys from the window's first tile (``masks.make_key_view``), dK/dV
    ends its queries where the window's left side leaves its keys (``masks.make_window``).
    ``SOFTCAP``, ``ALIBI``: P is recomputed from the score the forward's softmax saw
    (``common/score_mods.py``) and dS takes the cap's derivative ``1 - tanh^2`` (ALiBi's bias is
    a constant). A sink needs nothing here: the lse holds it, and ``dS = P (dP - D_i)`` is
    unchanged; its own gradient is ``simt/sink_grad.py``'s.
"""

import math
from functools import lru_cache

from numba import cuda, float32

from ...runtime.arrays import FLOAT_FORMATS
from ...runtime.spec import Sample, Tiles
from ..attention import DkdvSpec, DqSpec, PreprocessSpec, sample
from ..common import constants, formats
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import (make_key_view, make_kv_end, make_mask, make_q_begin,
                            make_seqlen_info, make_window)
from ..common.score_mods import make_score_mods
from ..instructions import sync
from .tiles import LANES_PER_ROW, ROW_GROUPS, THREADS, make_tile_loader, row_pad


def dkdv_strides(BLOCK_M, BLOCK_N, HEAD_DIM):
    """Row strides (float32 words) of the dK/dV kernel's Q, dO, K, V tiles and of P^T, dS^T."""
    return HEAD_DIM + 1, BLOCK_M + row_pad(BLOCK_N // ROW_GROUPS, BLOCK_M)


def dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The dK/dV kernel's shared tiles, in float32 words."""
    stride, p_stride = dkdv_strides(BLOCK_M, BLOCK_N, HEAD_DIM)
    return SharedLayout(4, [("k", BLOCK_N * stride), ("v", BLOCK_N * stride),
                            ("q", BLOCK_M * stride), ("do", BLOCK_M * stride),
                            ("p", BLOCK_N * p_stride), ("ds", BLOCK_N * p_stride),
                            ("lse", BLOCK_M), ("delta", BLOCK_M)])


def dq_strides(BLOCK_M, BLOCK_N, HEAD_DIM):
    """Row strides (float32 words) of the dQ kernel's Q, dO, K, V tiles and of dS."""
    return HEAD_DIM + 1, BLOCK_N + row_pad(BLOCK_M // ROW_GROUPS, BLOCK_N)


def dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The dQ kernel's shared tiles, in float32 words."""
    stride, ds_stride = dq_strides(BLOCK_M, BLOCK_N, HEAD_DIM)
    return SharedLayout(4, [("q", BLOCK_M * stride), ("do", BLOCK_M * stride),
                            ("k", BLOCK_N * stride), ("v", BLOCK_N * stride),
                            ("ds", BLOCK_M * ds_stride)])


def _make_score_products(ROWS, COLS, HEAD_DIM, STRIDE):
    """Device function ``score_products(smem, s_rows, s_cols, dp_rows, dp_cols, row0, lane, S,
    dP)``: this thread's micro-tiles of ``S = X Y^T`` and ``dP = U W^T``, where X, Y, U, W are
    the row-major shared tiles (row stride STRIDE) at offsets ``s_rows``, ``s_cols``,
    ``dp_rows``, ``dp_cols``; the thread owns rows ``row0 + i`` (i < ROWS) and columns ``lane + 8
    j`` (j < COLS). Both kernels need this pair, with the query and key tiles in swapped roles;
    one outer product per d, the column values read into registers once."""
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def score_products(smem, s_rows, s_cols, dp_rows, dp_cols, row0, lane, S, dP):
        s_col = cuda.local.array(COLS, float32)
        dp_col = cuda.local.array(COLS, float32)
        for i in range(ROWS):
            for j in range(COLS):
                S[i, j] = ZERO
                dP[i, j] = ZERO
        for d in range(HEAD_DIM):
            for j in range(COLS):
                c = lane + LANES_PER_ROW * j
                s_col[j] = smem[s_cols + c * STRIDE + d]
                dp_col[j] = smem[dp_cols + c * STRIDE + d]
            for i in range(ROWS):
                s_row = smem[s_rows + (row0 + i) * STRIDE + d]
                dp_row = smem[dp_rows + (row0 + i) * STRIDE + d]
                for j in range(COLS):
                    S[i, j] += s_row * s_col[j]
                    dP[i, j] += dp_row * dp_col[j]

    return score_products


# ----------------------------------------------------------------------------- preprocess

@lru_cache(maxsize=None)
def make_preprocess_kernel(HEAD_DIM, FMT):
    """Kernel writing ``delta[b, h, i] = D_i = sum_d dout[b, i, h, d] * out[b, i, h, d]``."""
    TD = HEAD_DIM // LANES_PER_ROW
    SCRATCH = sync.scratch_size(THREADS)
    load = formats.loader(FMT)
    shfl_xor = sync.shfl_xor
    ZERO = float32(0.0)

    def flash_bwd_preprocess_simt(out, dout, delta, seqlen_q, n_heads_q):
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        lane = tid & (LANES_PER_ROW - 1)
        bh = folded_row()
        if bh >= out.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        r = cuda.blockIdx.x * ROW_GROUPS + (tid >> 3)
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        D_i = ZERO
        if r < seqlen_q:
            for jd in range(TD):
                col = lane + LANES_PER_ROW * jd
                D_i += load(dout[b, r, h, col]) * load(out[b, r, h, col])
        # Every thread takes part in the shuffles (the simulator's barriers need them all).
        D_i += shfl_xor(D_i, 1, scratch, tid)
        D_i += shfl_xor(D_i, 2, scratch, tid)
        D_i += shfl_xor(D_i, 4, scratch, tid)
        if r < seqlen_q and lane == 0:
            delta[b, h, r] = D_i

    return flash_bwd_preprocess_simt


# ----------------------------------------------------------------------------- kernel 1: dK, dV

@lru_cache(maxsize=None)
def make_dkdv_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False, WINDOW=False,
                     SOFTCAP=False, ALIBI=False):
    """Kernel computing dK_j, dV_j for one tile of BLOCK_N keys of one (batch, kv head)."""
    assert BLOCK_N % ROW_GROUPS == 0 and BLOCK_M % LANES_PER_ROW == 0 and HEAD_DIM % 8 == 0
    TN = BLOCK_N // ROW_GROUPS       # kv rows per thread
    TM = BLOCK_M // LANES_PER_ROW    # query columns per thread in S^T, dP^T
    TD = HEAD_DIM // LANES_PER_ROW   # head-dim columns per thread in dK, dV
    lay = dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    K_OFF, V_OFF, Q_OFF, DO_OFF = lay.k, lay.v, lay.q, lay.do
    P_OFF, DS_OFF, LSE_OFF, DELTA_OFF = lay.p, lay.ds, lay.lse, lay.delta
    STRIDE, P_STRIDE = dkdv_strides(BLOCK_M, BLOCK_N, HEAD_DIM)
    load_kv = make_tile_loader(BLOCK_N, HEAD_DIM, STRIDE, 1, FMT)
    load_q = make_tile_loader(BLOCK_M, HEAD_DIM, STRIDE, 1, FMT)
    score_products = _make_score_products(TN, TM, HEAD_DIM, STRIDE)
    seqlen_info = make_seqlen_info(VARLEN)
    q_begin = make_q_begin(BLOCK_M, CAUSAL)
    masked_out = make_mask(CAUSAL)
    _, query_window, crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)
    score_factors, modified = make_score_mods(False, SOFTCAP, ALIBI)
    store = formats.storer(FMT)
    LOG2E = constants.LOG2E
    ZERO, ONE = float32(0.0), float32(1.0)

    def flash_bwd_dkdv_simt(q, k, v, dout, lse, delta, dk, dv, seqlen_q, seqlen_k, n_heads_k,
                            group, scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k,
                            status, window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        lane = tid & (LANES_PER_ROW - 1)
        row0 = (tid >> 3) * TN  # first of this thread's TN kv rows within the tile
        bh = folded_row()
        if bh >= k.shape[0] * n_heads_k:
            return  # past the last (batch, head): see common/grid.py
        n0 = cuda.blockIdx.x * BLOCK_N
        b = bh // n_heads_k
        hk = bh - b * n_heads_k
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            if n0 >= seqlen_k:
                return  # a key tile past the sequence's end
            q, dout, lse, delta = q[:, q0:], dout[:, q0:], lse[:, :, q0:], delta[:, :, q0:]
            k, v, dk, dv = k[:, k0:], v[:, k0:], dk[:, k0:], dv[:, k0:]

        # K_j, V_j stay in shared memory for the whole CTA; dK_j, dV_j in registers.
        load_kv(smem, K_OFF, k, b, n0, hk, seqlen_k, ONE, tid)
        load_kv(smem, V_OFF, v, b, n0, hk, seqlen_k, ONE, tid)
        dK_j = cuda.local.array((TN, TD), float32)
        dV_j = cuda.local.array((TN, TD), float32)
        S = cuda.local.array((TN, TM), float32)   # S_ij^T
        dP = cuda.local.array((TN, TM), float32)  # dP_ij^T
        for i in range(TN):
            for jd in range(TD):
                dK_j[i, jd] = ZERO
                dV_j[i, jd] = ZERO

        # Sliding window: the queries past its left side see none of these keys.
        rel0 = diag  # i + diag - j: ALiBi's distance
        seqlen_q, diag, diag_lo = query_window(n0, diag, seqlen_q, window_left, window_right)
        # Queries that may see these keys: all, or (causal) from the first tile reaching them.
        m_begin = q_begin(n0, diag)
        ragged = n0 + BLOCK_N > seqlen_k
        for h in range(hk * group, hk * group + group):
            mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
            for m0 in range(m_begin, seqlen_q, BLOCK_M):
                cuda.syncthreads()  # the previous step's Q, dO, P, dS are no longer read
                load_q(smem, Q_OFF, q, b, m0, h, seqlen_q, ONE, tid)
                load_q(smem, DO_OFF, dout, b, m0, h, seqlen_q, ONE, tid)
                for r in range(tid, BLOCK_M, THREADS):
                    lse_r = ZERO  # padded rows: Q = dO = 0, so P = 1 there adds nothing
                    D_r = ZERO
                    if m0 + r < seqlen_q:
                        lse_r = lse[b, h, m0 + r] * LOG2E
                        D_r = delta[b, h, m0 + r]
                    smem[LSE_OFF + r] = lse_r
                    smem[DELTA_OFF + r] = D_r
                cuda.syncthreads()

                # S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T.
                score_products(smem, K_OFF, Q_OFF, V_OFF, DO_OFF, row0, lane, S, dP)

                # P_ij^T = exp2(S^T * scale_log2 - lse_i), dS_ij^T = P^T (dP^T - D_i) -> shared.
                # The tile test of common/masks.py, written out: through the inline helper
                # NVVM schedules this loop's address arithmetic differently.
                masked = ragged or crosses_begin(n0, m0, diag_lo)
                if CAUSAL:
                    masked = masked or n0 + BLOCK_N - 1 > m0 + diag
                for j in range(TM):
                    c = lane + LANES_PER_ROW * j
                    lse_c = smem[LSE_OFF + c]
                    D_c = smem[DELTA_OFF + c]
                    for i in range(TN):
                        key = n0 + row0 + i
                        visible = not masked or not (masked_out(m0 + c, key, diag, seqlen_k) or (
                            WINDOW and key < m0 + c + diag_lo))
                        sc, slope = modified(S[i, j], mods,
                                             mods[3] + float32(m0 + c - key))
                        p = ZERO
                        if visible:
                            p = math.exp2(sc * scale_log2 - lse_c)
                        smem[P_OFF + (row0 + i) * P_STRIDE + c] = p
                        smem[DS_OFF + (row0 + i) * P_STRIDE + c] = p * (dP[i, j] - D_c) * slope
                cuda.syncthreads()

                # dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i (scale applied once, at the end).
                for c in range(BLOCK_M):
                    for i in range(TN):
                        p = smem[P_OFF + (row0 + i) * P_STRIDE + c]
                        ds = smem[DS_OFF + (row0 + i) * P_STRIDE + c]
                        for jd in range(TD):
                            col = c * STRIDE + lane + LANES_PER_ROW * jd
                            dV_j[i, jd] += p * smem[DO_OFF + col]
                            dK_j[i, jd] += ds * smem[Q_OFF + col]

        for i in range(TN):
            r = n0 + row0 + i
            if r < seqlen_k:
                for jd in range(TD):
                    col = lane + LANES_PER_ROW * jd
                    dk[b, r, hk, col] = store(dK_j[i, jd] * scale)
                    dv[b, r, hk, col] = store(dV_j[i, jd])

    return flash_bwd_dkdv_simt


# ----------------------------------------------------------------------------- kernel 2: dQ

@lru_cache(maxsize=None)
def make_dq_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False, WINDOW=False,
                   SOFTCAP=False, ALIBI=False):
    """Kernel computing dQ_i for one tile of BLOCK_M queries of one (batch, query head)."""
    assert BLOCK_M % ROW_GROUPS == 0 and BLOCK_N % LANES_PER_ROW == 0 and HEAD_DIM % 8 == 0
    TM = BLOCK_M // ROW_GROUPS       # query rows per thread
    TN = BLOCK_N // LANES_PER_ROW    # key columns per thread in S, dP
    TD = HEAD_DIM // LANES_PER_ROW   # head-dim columns per thread in dQ
    lay = dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    Q_OFF, DO_OFF, K_OFF, V_OFF, DS_OFF = lay.q, lay.do, lay.k, lay.v, lay.ds
    STRIDE, DS_STRIDE = dq_strides(BLOCK_M, BLOCK_N, HEAD_DIM)
    load_q = make_tile_loader(BLOCK_M, HEAD_DIM, STRIDE, 1, FMT)
    load_kv = make_tile_loader(BLOCK_N, HEAD_DIM, STRIDE, 1, FMT)
    score_products = _make_score_products(TM, TN, HEAD_DIM, STRIDE)
    seqlen_info = make_seqlen_info(VARLEN)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    masked_out = make_mask(CAUSAL)
    crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)[2]
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW)
    score_factors, modified = make_score_mods(False, SOFTCAP, ALIBI)
    store = formats.storer(FMT)
    LOG2E = constants.LOG2E
    ZERO, ONE = float32(0.0), float32(1.0)

    def flash_bwd_dq_simt(q, k, v, dout, lse, delta, dq, seqlen_q, seqlen_k, n_heads_q, group,
                          scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k, status,
                          window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        lane = tid & (LANES_PER_ROW - 1)
        row0 = (tid >> 3) * TM  # first of this thread's TM query rows within the tile
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = cuda.blockIdx.x * BLOCK_M
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            if m0 >= seqlen_q:
                return  # a query tile past the sequence's end
            q, dout, lse, delta, dq = (q[:, q0:], dout[:, q0:], lse[:, :, q0:], delta[:, :, q0:],
                                       dq[:, q0:])
            k, v = k[:, k0:], v[:, k0:]
        # Sliding window: keys from the first tile it reaches, diagonals relative to it.
        k, v, _, seqlen_k, rel0, diag, diag_lo = key_view(k, v, status, m0, diag, seqlen_k,
                                                          window_left, window_right)
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)

        # Q_i, dO_i stay in shared memory; lse_i, D_i and dQ_i in registers.
        load_q(smem, Q_OFF, q, b, m0, h, seqlen_q, ONE, tid)
        load_q(smem, DO_OFF, dout, b, m0, h, seqlen_q, ONE, tid)
        lse_i = cuda.local.array(TM, float32)
        D_i = cuda.local.array(TM, float32)
        dQ_i = cuda.local.array((TM, TD), float32)
        S = cuda.local.array((TM, TN), float32)
        dP = cuda.local.array((TM, TN), float32)
        for i in range(TM):
            r = m0 + row0 + i
            lse_i[i] = ZERO  # padded rows: Q = dO = 0, so dS = 0 there
            D_i[i] = ZERO
            if r < seqlen_q:
                lse_i[i] = lse[b, h, r] * LOG2E
                D_i[i] = delta[b, h, r]
            for jd in range(TD):
                dQ_i[i, jd] = ZERO

        # Keys these queries may see: all, or (causal) up to the diagonal (as in the forward).
        for n0 in range(0, kv_end(m0, diag, seqlen_k), BLOCK_N):
            cuda.syncthreads()  # the previous tile's K, V, dS are no longer read
            load_kv(smem, K_OFF, k, b, n0, hk, seqlen_k, ONE, tid)
            load_kv(smem, V_OFF, v, b, n0, hk, seqlen_k, ONE, tid)
            cuda.syncthreads()

            # S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T.
            score_products(smem, Q_OFF, K_OFF, DO_OFF, V_OFF, row0, lane, S, dP)

            # dS_ij = P_ij (dP_ij - D_i) with P_ij = exp2(S * scale_log2 - lse_i) -> shared.
            masked = n0 + BLOCK_N > seqlen_k  # common/masks.py's tile test, written out (above)
            masked = masked or crosses_begin(n0, m0, diag_lo)
            if CAUSAL:
                masked = masked or n0 + BLOCK_N - 1 > m0 + diag
            for i in range(TM):
                for j in range(TN):
                    key = n0 + lane + LANES_PER_ROW * j
                    row = m0 + row0 + i
                    visible = not masked or not (masked_out(row, key, diag, seqlen_k) or (
                        WINDOW and key < row + diag_lo))
                    sc, slope = modified(S[i, j], mods, mods[3] + float32(row - key))
                    p = ZERO
                    if visible:
                        p = math.exp2(sc * scale_log2 - lse_i[i])
                    smem[DS_OFF + (row0 + i) * DS_STRIDE + lane + LANES_PER_ROW * j] = \
                        p * (dP[i, j] - D_i[i]) * slope
            cuda.syncthreads()

            # dQ_i += dS_ij K_j (scale applied once, at the end).
            for c in range(BLOCK_N):
                for i in range(TM):
                    ds = smem[DS_OFF + (row0 + i) * DS_STRIDE + c]
                    for jd in range(TD):
                        dQ_i[i, jd] += ds * smem[K_OFF + c * STRIDE + lane + LANES_PER_ROW * jd]

        for i in range(TM):
            r = m0 + row0 + i
            if r < seqlen_q:
                for jd in range(TD):
                    dq[b, r, h, lane + LANES_PER_ROW * jd] = store(dQ_i[i, jd] * scale)

    return flash_bwd_dq_simt


# ----------------------------------------------------------------------------- specs

# By head dim: (BLOCK_M, BLOCK_N) of the dK/dV kernel (BLOCK_N keys held, BLOCK_M queries
# streamed) and of the dQ kernel (BLOCK_M queries held, BLOCK_N keys streamed). The register
# accumulators grow as HEAD_DIM / 8 per owned row, so larger head dims own fewer rows (dQ at 256
# with 32 query rows needs ~250 registers, at the edge of spilling). No spills on sm_80 / sm_90
# (at most ~210 registers, the PTX test checks); shared memory <= 106 KiB, so an A100 fits.
TILES = ((64, (32, 64), (64, 32)), (128, (32, 32), (64, 32)), (256, (32, 16), (16, 32)))


def _samples(kernel, more=()):
    """A tiled kernel's samples: the largest head dim of each tile class, causal or not, in
    bfloat16, one varlen, a sliding window dense and varlen, a softcap, ALiBi, then the configs
    ``more``."""
    configs = [(d, causal, "bfloat16") for d, _, _ in TILES for causal in (False, True)]
    configs.append((64, True, "bfloat16", True))
    configs += [(64, True, "float16", False, False, True),
                (64, True, "bfloat16", True, False, True),
                (64, False, "bfloat16", False, False, False, True),
                (64, True, "float16", False, False, False, False, True)]
    return [sample(f"simt bwd {kernel}", config) for config in configs + list(more)]


class Preprocess(PreprocessSpec):
    """ROW_GROUPS query rows of D per block; no tiles, no shared memory."""

    name = "flash_bwd_preprocess_simt"

    def entry(self, config, device):
        return ROW_GROUPS

    def tiles(self, config, entry):
        return Tiles(entry, 0, THREADS, 0)

    def make(self, config, tiles):
        return make_preprocess_kernel(config.head_dim, config.fmt)

    def samples(self):
        return [Sample(f"simt bwd preprocess d=256 {fmt}", (256, False, fmt))
                for fmt in FLOAT_FORMATS]


class Dkdv(DkdvSpec):
    name = "flash_bwd_dkdv_simt"

    def entry(self, config, device):
        return next(t for t in TILES if config.head_dim <= t[0])[1]

    def tiles(self, config, entry):
        bm, bn = entry
        return Tiles(bm, bn, THREADS, dkdv_shared_layout(bm, bn, config.head_dim).bytes)

    def make(self, config, tiles):
        return make_dkdv_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                config.fmt, config.varlen, config.window, config.softcap,
                                config.alibi)

    def samples(self):
        return _samples("dkdv", [(d, False, "float32") for d, _, _ in TILES])


class Dq(DqSpec):
    name = "flash_bwd_dq_simt"

    def entry(self, config, device):
        return next(t for t in TILES if config.head_dim <= t[0])[2]

    def tiles(self, config, entry):
        bm, bn = entry
        return Tiles(bm, bn, THREADS, dq_shared_layout(bm, bn, config.head_dim).bytes)

    def make(self, config, tiles):
        return make_dq_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                              config.fmt, config.varlen, config.window, config.softcap,
                              config.alibi)

    def samples(self):
        return _samples("dq")


PREPROCESS, DKDV, DQ = Preprocess(), Dkdv(), Dq()
