"""FlashAttention backward on tensor cores: FA2's two kernels with ``mma.sync``, no atomics.

What it computes
    The gradients of ``O = softmax(scale Q K^T) V`` for the incoming dO, as
    ``kernels/simt/backward.py`` does (read that one first: the recomputation from lse, D_i and
    the causal rules are the same), with every matrix product on the tensor cores as
    ``mma.sync.m16n8k16`` (``tc/forward_mma.py`` explains the fragments). With
    ``P_ij = exp2(S_ij scale_log2 - lse_i log2 e)`` recomputed from the forward's lse and the
    preprocess' ``D_i = rowsum(dO_i * O_i)``:

        dV_j += P_ij^T dO_i        dP_ij = dO_i V_j^T        dS_ij = P_ij * (dP_ij - D_i)
        dK_j += dS_ij^T Q_i * scale                          dQ_i += dS_ij K_j * scale

    Kernel 1 (dK, dV) holds a key tile and streams the query tiles that see it, for every query
    head of its kv head's group, in a fixed order: dK and dV sum the group without atomics.
    Kernel 2 (dQ) holds a query tile and streams its key tiles. Every output is written by one
    CTA, once: the backward is bitwise reproducible.

Grid / block mapping
    dK/dV: grid (B * Hk, ceil(Sk / BLOCK_N)); NWARPS warps, BLOCK_N = 16 NWARPS keys, warp ``w``
    owns keys ``16 w .. 16 w + 15`` of the tile and computes the transposed products, keys as the
    rows of its C fragments: S^T = K_j Q_i^T and dP^T = V_j dO_i^T (A from shared memory as in the
    forward's Q K^T), then dV += P^T dO and dK += dS^T Q with P^T, dS^T from registers as the A
    operand and dO, Q through ``ldmatrix.trans`` (as V in the forward's P V).
    dQ: grid (B * Hq, ceil(Sq / BLOCK_M)), causal query tiles from the last; BLOCK_M = 16 NWARPS,
    warp ``w`` owns query rows ``16 w ..``: S = Q K^T and dP = dO V^T, then dQ += dS K with K
    through ``ldmatrix.trans``. B * H is the grid's x (up to 2^31 - 1), the tiles its y.
    Per thread: S and dP (BLOCK / 8 x 4 floats each) and the accumulators (HEAD_DIM / 8 x 4
    floats each: dK and dV, or dQ).

Memory pipeline
    cp.async 16-byte copies (``common/copies.py``). dK/dV: K_j and V_j once; Q_i and dO_i double
    buffered, tile i + 1 in flight while tile i is computed (one barrier per tile). dQ: Q_i and
    dO_i once; K_j and V_j double buffered, as the forward's key loop.

Shared memory (16-bit elements, rows padded by 8 elements: conflict-free ldmatrix)
    dK/dV: K, V  BLOCK_N x (DPAD + 8) each; Q, dO  2 x BLOCK_M x (DPAD + 8) each; plus BLOCK_M
    float32 of lse_i log2 e and of D_i per buffer (DPAD: a multiple of 16 per warp sharing the
    head dim). dQ: Q, dO  BLOCK_M x (DPAD + 8) each; K, V
    2 x BLOCK_N x (DPAD + 8) each. e.g. D = 128, 64 x 64 tiles: 102 KiB.

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 8 up to 256; any Sq, Sk; q, k, v, dout with rows
    and data pointers 16-byte aligned (the host checks); compute capability 8.0 or newer.
    Dense batches, or packed varlen sequences (``VARLEN``): each CTA takes its sequence's
    rows from ``common/masks.make_seqlen_info`` and returns when its tile lies past the
    sequence's end (kernels/attention.py). Masks and score modifiers: the compile-time
    ``WINDOW``, ``SOFTCAP`` and ``ALIBI`` of ``simt/backward.py``, through the same pieces
    (``common/masks.py``, ``common/backward.py``, ``common/score_mods.py``).
"""

from functools import lru_cache

from numba import cuda, float32, uint16, uint32

from ...runtime.spec import Tiles
from ..attention import HALF_FORMATS, DkdvSpec, DqSpec, grid_lengths, sample
from ..common import backward
from ..common.copies import make_tile_copy
from ..common.epilogue import make_fragment_store
from ..common.layout import SharedLayout
from ..common.masks import (make_key_view, make_kv_end, make_q_begin, make_seqlen_info,
                            make_window)
from ..common.score_mods import make_score_mods
from ..instructions import convert, memory
from ..instructions import mma as mma_sync

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
PAD = 8  # elements of row padding in shared memory (16 bytes)


def padded_head_dim(head_dim, dsplit=1):
    """HEAD_DIM rounded up to the k-step of mma (16), times the warps that split it."""
    return -(-head_dim // (16 * dsplit)) * 16 * dsplit


def dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, NWARPS):
    """The dK/dV kernel's tiles, in 16-bit elements: K, V, the Q and dO double buffers, then
    lse_i log2 e and D_i of each buffer (4 BLOCK_M float32)."""
    stride = padded_head_dim(HEAD_DIM, 16 * NWARPS // BLOCK_N) + PAD
    return SharedLayout(2, [("k", BLOCK_N * stride), ("v", BLOCK_N * stride),
                            ("q", 2 * BLOCK_M * stride), ("do", 2 * BLOCK_M * stride),
                            ("rows", 2 * 4 * BLOCK_M)])


def dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The dQ kernel's tiles, in 16-bit elements: Q, dO, then the K and V double buffers."""
    stride = padded_head_dim(HEAD_DIM) + PAD
    return SharedLayout(2, [("q", BLOCK_M * stride), ("do", BLOCK_M * stride),
                            ("k", 2 * BLOCK_N * stride), ("v", 2 * BLOCK_N * stride)])


def _make_products(STRIDE, KSTEPS, NT, DT, FMT, THREADS):
    """The two product shapes of both kernels, for a warp's 16 rows:

    ``scores(C, a_lane, b_lane, smem, scratch, tid)``: C (NT, 4) = A B^T, A the warp's 16 rows at
    ``a_lane`` and B NT * 8 rows at ``b_lane`` of shared memory, both [rows][d] (S = Q K^T);
    ``accumulate(C, P, b_lane, smem, scratch, tid)``: C (DT, 4) += P B, P (NT, 4) the fragments
    of a scores product (packed to 16 bits: the A operand) and B NT * 8 rows [k][d] through
    ``ldmatrix.trans`` (O += P V)."""
    mma, pack = mma_sync.mma(FMT), convert.pack(FMT)
    ldsm_x4, ldsm_x4_t = mma_sync.ldmatrix_x4, mma_sync.ldmatrix_x4_trans
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def mma_pair(a, b0, b1, b2, b3, C, t, scratch, tid):
        c0 = mma(a, (b0, b1), (C[t, 0], C[t, 1], C[t, 2], C[t, 3]), scratch, tid)
        c1 = mma(a, (b2, b3), (C[t + 1, 0], C[t + 1, 1], C[t + 1, 2], C[t + 1, 3]), scratch,
                 tid)
        for e in range(4):
            C[t, e] = c0[e]
            C[t + 1, e] = c1[e]

    @cuda.jit(device=True, inline="always")
    def scores(C, a_lane, b_lane, smem, scratch, tid):
        for nt in range(NT):
            for e in range(4):
                C[nt, e] = ZERO
        for ks in range(KSTEPS):
            a = ldsm_x4(smem, a_lane + 16 * ks, scratch, tid)
            for np2 in range(NT // 2):
                b0, b1, b2, b3 = ldsm_x4(smem, b_lane + 16 * np2 * STRIDE + 16 * ks, scratch,
                                         tid)
                mma_pair(a, b0, b1, b2, b3, C, 2 * np2, scratch, tid)

    @cuda.jit(device=True, inline="always")
    def accumulate(C, P, b_lane, smem, scratch, tid):
        for kk in range(NT // 2):
            pa = (pack(P[2 * kk, 0], P[2 * kk, 1]), pack(P[2 * kk, 2], P[2 * kk, 3]),
                  pack(P[2 * kk + 1, 0], P[2 * kk + 1, 1]),
                  pack(P[2 * kk + 1, 2], P[2 * kk + 1, 3]))
            for dp in range(DT // 2):
                b0, b1, b2, b3 = ldsm_x4_t(smem, b_lane + 16 * kk * STRIDE + 16 * dp, scratch,
                                           tid)
                mma_pair(pa, b0, b1, b2, b3, C, 2 * dp, scratch, tid)

    return scores, accumulate


@lru_cache(maxsize=None)
def make_dkdv_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, NWARPS, VARLEN=False,
                     WINDOW=False, SOFTCAP=False, ALIBI=False):
    """Kernel 1: dK_j, dV_j of one tile of BLOCK_N keys of one (batch, kv head). NWARPS = 16 /
    BLOCK_N DSPLIT warps: DSPLIT warps share each 16 keys, each accumulating dK, dV for one
    DSPLIT-th of the head dim (at HEAD_DIM 256 the whole rows would not fit the registers)."""
    DSPLIT = 16 * NWARPS // BLOCK_N
    assert FMT in ("float16", "bfloat16") and BLOCK_N * DSPLIT == 16 * NWARPS
    assert BLOCK_M % 16 == 0
    THREADS = 32 * NWARPS
    DPAD = padded_head_dim(HEAD_DIM, DSPLIT)
    STRIDE = DPAD + PAD
    D_W = DPAD // DSPLIT                      # head-dim columns of a warp's dK, dV
    KSTEPS, NT, DT = DPAD // 16, BLOCK_M // 8, D_W // 8
    lay = dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, NWARPS)
    K_OFF, V_OFF, Q_OFF, DO_OFF = lay.k, lay.v, lay.q, lay.do
    TILE = BLOCK_M * STRIDE                   # elements of one Q (or dO) buffer
    ROWS_OFF = lay.rows // 2                  # float32 words: lse_i log2 e, D_i per buffer
    SCRATCH = mma_sync.scratch_size(THREADS)
    scores, accumulate = _make_products(STRIDE, KSTEPS, NT, DT, FMT, THREADS)
    copy_slot, copy_rows, _ = make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS)
    store_row = make_fragment_store(HEAD_DIM, DT, FMT)
    seqlen_info = make_seqlen_info(VARLEN)
    q_begin = make_q_begin(BLOCK_M, CAUSAL)
    stage_rows = backward.make_dkdv_rows(BLOCK_M, THREADS)
    scores_to_ds = backward.make_dkdv_scores_to_ds(NT, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                                                 SOFTCAP, ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    query_window = make_window(BLOCK_M, BLOCK_N, WINDOW)[1]
    ZERO, ONE = float32(0.0), float32(1.0)

    def flash_bwd_dkdv_tc(q, k, v, dout, lse, delta, dk, dv, seqlen_q, seqlen_k, n_heads_k,
                          group, scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k, status,
                          window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)  # the same bytes
        scratch = cuda.shared.array(SCRATCH, uint32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        r0, c = copy_slot(tid)
        a_row, a_col = mma_sync.ldmatrix_a_rowcol(lane)
        b_row, b_col = mma_sync.ldmatrix_b_rowcol(lane)
        b = cuda.blockIdx.x // n_heads_k
        hk = cuda.blockIdx.x - b * n_heads_k
        n0 = cuda.blockIdx.y * BLOCK_N
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            if n0 >= seqlen_k:
                return  # a key tile past the sequence's end
            q, dout, lse, delta = q[:, q0:], dout[:, q0:], lse[:, :, q0:], delta[:, :, q0:]
            k, v, dk, dv = k[:, k0:], v[:, k0:], dk[:, k0:], dv[:, k0:]

        # Sliding window: the queries past its left side see none of these keys.
        rel0 = diag  # i + diag - j: ALiBi's distance
        seqlen_q, diag, diag_lo = query_window(n0, diag, seqlen_q, window_left, window_right)
        # Queries that may see these keys: all, or (causal) from the first tile reaching them.
        m_begin = q_begin(n0, diag)
        q_tiles = (seqlen_q - m_begin + BLOCK_M - 1) // BLOCK_M if seqlen_q > m_begin else 0
        steps = group * q_tiles  # (query head, query tile) pairs, in order

        copy_rows(smem, K_OFF, k, b, n0, hk, BLOCK_N, seqlen_k, r0, c)
        copy_rows(smem, V_OFF, v, b, n0, hk, BLOCK_N, seqlen_k, r0, c)
        if steps > 0:
            copy_rows(smem, Q_OFF, q, b, m_begin, hk * group, BLOCK_M, seqlen_q, r0, c)
            copy_rows(smem, DO_OFF, dout, b, m_begin, hk * group, BLOCK_M, seqlen_q, r0, c)
        memory.cp_async_commit()

        dK = cuda.local.array((DT, 4), float32)
        dV = cuda.local.array((DT, 4), float32)
        S = cuda.local.array((NT, 4), float32)   # S^T, then P^T
        dP = cuda.local.array((NT, 4), float32)  # dP^T, then dS^T
        for dt in range(DT):
            for e in range(4):
                dK[dt, e] = ZERO
                dV[dt, e] = ZERO
        keys = 16 * (warp // DSPLIT)  # the warp's keys in the tile ...
        col0 = D_W * (warp - (warp // DSPLIT) * DSPLIT)  # ... and its head-dim columns
        key_g = n0 + keys + g  # the key of this thread's fragment rows (and + 8)
        k_lane = K_OFF + (keys + a_row) * STRIDE + a_col
        v_lane = V_OFF + (keys + a_row) * STRIDE + a_col

        for step in range(steps):
            h = hk * group + step // q_tiles
            m0 = m_begin + (step - (step // q_tiles) * q_tiles) * BLOCK_M
            buf = (step & 1) * TILE
            rows = ROWS_OFF + (step & 1) * 2 * BLOCK_M
            # lse_i log2 e and D_i of this tile (+inf, 0 past the queries: P = 0 there).
            stage_rows(words, rows, lse, delta, b, h, m0, seqlen_q, tid)
            memory.cp_async_wait(0)  # tile i (and K, V) landed ...
            cuda.syncthreads()       # ... for every thread; every warp is done with tile i - 1
            if step + 1 < steps:     # so its buffers take tile i + 1 while tile i is computed
                nh = hk * group + (step + 1) // q_tiles
                nm = m_begin + (step + 1 - ((step + 1) // q_tiles) * q_tiles) * BLOCK_M
                copy_rows(smem, Q_OFF + TILE - buf, q, b, nm, nh, BLOCK_M, seqlen_q, r0, c)
                copy_rows(smem, DO_OFF + TILE - buf, dout, b, nm, nh, BLOCK_M, seqlen_q, r0, c)
                memory.cp_async_commit()

            # S^T = K_j Q_i^T and dP^T = V_j dO_i^T: keys are the fragment rows.
            scores(S, k_lane, Q_OFF + buf + b_row * STRIDE + b_col, smem, scratch, tid)
            scores(dP, v_lane, DO_OFF + buf + b_row * STRIDE + b_col, smem, scratch, tid)

            # P^T = exp2(S^T scale_log2 - lse_i log2 e), masked above the causal diagonal;
            # dS^T = P^T (dP^T - D_i). Element (nt, e): key key_g + 8 (e >> 1), query
            # m0 + t2 + 8 nt + (e & 1).
            mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
            scores_to_ds(S, dP, words, rows, m0, n0, key_g, t2, diag, diag_lo, scale_log2,
                         mods)

            # dV_j += P^T dO_i and dK_j += dS^T Q_i, queries as the reduction.
            accumulate(dV, S, DO_OFF + buf + a_row * STRIDE + a_col + col0, smem, scratch, tid)
            accumulate(dK, dP, Q_OFF + buf + a_row * STRIDE + a_col + col0, smem, scratch, tid)

        memory.cp_async_wait(0)  # K, V (and nothing else) where no query tile waited
        for half in range(2):
            store_row(dk, b, key_g + 8 * half, hk, seqlen_k, dK, half, col0, t2, scale)
            store_row(dv, b, key_g + 8 * half, hk, seqlen_k, dV, half, col0, t2, ONE)

    return flash_bwd_dkdv_tc


@lru_cache(maxsize=None)
def make_dq_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, NWARPS, VARLEN=False,
                   WINDOW=False, SOFTCAP=False, ALIBI=False):
    """Kernel 2: dQ_i of one tile of BLOCK_M = 16 NWARPS queries of one (batch, query head)."""
    assert FMT in ("float16", "bfloat16") and BLOCK_M == 16 * NWARPS and BLOCK_N % 16 == 0
    THREADS = 32 * NWARPS
    DPAD = padded_head_dim(HEAD_DIM)
    STRIDE = DPAD + PAD
    KSTEPS, NT, DT = DPAD // 16, BLOCK_N // 8, DPAD // 8
    lay = dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    Q_OFF, DO_OFF, K_OFF, V_OFF = lay.q, lay.do, lay.k, lay.v
    TILE = BLOCK_N * STRIDE                  # elements of one K (or V) buffer
    SCRATCH = mma_sync.scratch_size(THREADS)
    scores, accumulate = _make_products(STRIDE, KSTEPS, NT, DT, FMT, THREADS)
    copy_slot, copy_rows, _ = make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS)
    store_row = make_fragment_store(HEAD_DIM, DT, FMT)
    seqlen_info = make_seqlen_info(VARLEN)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    load_rows = backward.make_dq_rows()
    scores_to_ds = backward.make_dq_scores_to_ds(NT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW,
                                                 SOFTCAP, ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW)
    ZERO = float32(0.0)

    def flash_bwd_dq_tc(q, k, v, dout, lse, delta, dq, seqlen_q, seqlen_k, n_heads_q, group,
                        scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k, status,
                        window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        scratch = cuda.shared.array(SCRATCH, uint32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        r0, c = copy_slot(tid)
        a_row, a_col = mma_sync.ldmatrix_a_rowcol(lane)
        b_row, b_col = mma_sync.ldmatrix_b_rowcol(lane)
        b = cuda.blockIdx.x // n_heads_q
        h = cuda.blockIdx.x - b * n_heads_q
        hk = h // group
        # Causal: the longest query tiles first (the grid's last CTAs are then the short ones).
        m0 = (cuda.gridDim.y - 1 - cuda.blockIdx.y if CAUSAL else cuda.blockIdx.y) * BLOCK_M
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
        end = kv_end(m0, diag, seqlen_k)
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0

        copy_rows(smem, Q_OFF, q, b, m0, h, BLOCK_M, seqlen_q, r0, c)
        copy_rows(smem, DO_OFF, dout, b, m0, h, BLOCK_M, seqlen_q, r0, c)
        if n_tiles > 0:
            copy_rows(smem, K_OFF, k, b, 0, hk, BLOCK_N, seqlen_k, r0, c)
            copy_rows(smem, V_OFF, v, b, 0, hk, BLOCK_N, seqlen_k, r0, c)
        memory.cp_async_commit()

        dQ = cuda.local.array((DT, 4), float32)
        S = cuda.local.array((NT, 4), float32)   # S, then P
        dP = cuda.local.array((NT, 4), float32)  # dP, then dS
        for dt in range(DT):
            for e in range(4):
                dQ[dt, e] = ZERO
        row_g = m0 + 16 * warp + g  # this thread's fragment rows: row_g and row_g + 8
        lse_r = cuda.local.array(2, float32)  # lse_i log2 e and D_i of the two rows
        D_r = cuda.local.array(2, float32)
        load_rows(lse_r, D_r, lse, delta, b, h, row_g, seqlen_q)
        q_lane = Q_OFF + (16 * warp + a_row) * STRIDE + a_col
        do_lane = DO_OFF + (16 * warp + a_row) * STRIDE + a_col

        for j in range(n_tiles):
            n0 = j * BLOCK_N
            buf = (j & 1) * TILE
            memory.cp_async_wait(0)
            cuda.syncthreads()
            if j + 1 < n_tiles:
                copy_rows(smem, K_OFF + TILE - buf, k, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                          r0, c)
                copy_rows(smem, V_OFF + TILE - buf, v, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                          r0, c)
                memory.cp_async_commit()

            # S = Q_i K_j^T and dP = dO_i V_j^T.
            scores(S, q_lane, K_OFF + buf + b_row * STRIDE + b_col, smem, scratch, tid)
            scores(dP, do_lane, V_OFF + buf + b_row * STRIDE + b_col, smem, scratch, tid)

            # P = exp2(S scale_log2 - lse_i log2 e), masked past the keys and the diagonal;
            # dS = P (dP - D_i). Element (nt, e): row row_g + 8 (e >> 1), key n0 + t2 + 8 nt
            # + (e & 1).
            scores_to_ds(S, dP, lse_r, D_r, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                         scale_log2, mods)

            # dQ_i += dS K_j, keys as the reduction.
            accumulate(dQ, dP, K_OFF + buf + a_row * STRIDE + a_col, smem, scratch, tid)

        memory.cp_async_wait(0)
        for half in range(2):
            store_row(dq, b, row_g + 8 * half, h, seqlen_q, dQ, half, 0, t2, scale)

    return flash_bwd_dq_tc


# ----------------------------------------------------------------------------- specs

# (BLOCK_M, BLOCK_N, warps) by head dim, non-causal and causal: dK/dV holds BLOCK_N = 16 warps /
# DSPLIT keys and streams BLOCK_M queries; dQ holds BLOCK_M = 16 warps queries and streams
# BLOCK_N keys. Measured by bench/tune_tc_backward.py on an H200 at N = 4096 (ms per kernel,
# bench/results/NVIDIA-H200/tune_tc_backward.csv):
#   dK/dV D = 64:  64 x 64 x 4: 12.0 / 6.58 (non-causal / causal) against 16.2 / 6.63 for 32 x 64
#                  and 12.6 / 7.22 for 64 x 128 x 8; 128 x 64 x 4 (10.1 / 5.33) spills;
#   dK/dV D = 128: 64 x 64 x 4: 9.30 non-causal against 11.5 for 32 x 64 x 4 and 9.82 for
#                  64 x 128 x 8; causal it spills, and 32 x 64 x 4 (5.76) is the best that does not;
#   dQ D = 64:     128 x 32 x 8: 6.18 non-causal (64 x 64 x 4: 6.80); 64 x 64 x 4: 3.47 causal;
#   dQ D = 128:    128 x 64 x 8: 6.30 non-causal (64 x 64 x 4: 6.68); 64 x 64 x 4: 3.26 causal;
#   D = 256: spill-free tiles (at most 64 dK/dV and 128 dQ floats per thread), not swept.
TILES = ((64, ((64, 64, 4), (64, 64, 4)), ((128, 32, 8), (64, 64, 4))),
         (128, ((64, 64, 4), (32, 64, 4)), ((128, 64, 8), (64, 64, 4))),
         (256, ((32, 32, 4), (32, 32, 4)), ((64, 32, 4), (64, 32, 4))))
# Where a block may not have the table's shared memory (sm_86 / sm_89: 99 KiB, against up to
# 136 KiB above), the smaller tiles of the same kernel that fit there (at most 70 KiB).
SMALL_TILES = ((128, (32, 64, 4), (64, 32, 4)), (256, (16, 32, 4), (32, 16, 2)))


def _samples(kernel, column):
    """Head dims 8 and 72 with the table's entries; every entry of the table, causal or not, in
    both formats; the small tiles; varlen at head dim 64; a sliding window, dense at head dim
    128 and varlen at 64; a softcap at 128; ALiBi with a softcap at 128."""
    name = f"tc mma bwd {kernel}"
    return ([sample(name, config) for config in ((8, True, "float16"), (72, False, "bfloat16"),
                                                 (64, True, "bfloat16", True),
                                                 (128, True, "float16", False, False, True),
                                                 (64, True, "bfloat16", True, False, True),
                                                 (128, False, "bfloat16", False, False, False,
                                                  True),
                                                 (128, True, "float16", False, False, False,
                                                  True, True))]
            + [sample(name, (row[0], causal, fmt), row[column][int(causal)]) for row in TILES
               for causal in (False, True) for fmt in HALF_FORMATS]
            + [sample(name, (row[0], True, "bfloat16"), row[column]) for row in SMALL_TILES])


def _entry(config, device, column, shared_bytes):
    entry = next(t for t in TILES if config.head_dim <= t[0])[column][int(config.causal)]
    if device is not None and shared_bytes(entry) > device.shared_per_block:
        entry = next(t for t in SMALL_TILES if config.head_dim <= t[0])[column]
    return entry


class Dkdv(DkdvSpec):
    name = "flash_bwd_dkdv_tc"
    unroll_loops = True

    def entry(self, config, device):
        return _entry(config, device, 1, lambda e: self.tiles(config, e).shared_bytes)

    def tiles(self, config, entry):
        bm, bn, warps = entry
        return Tiles(bm, bn, 32 * warps,
                     dkdv_shared_layout(bm, bn, config.head_dim, warps).bytes)

    def make(self, config, tiles):
        return make_dkdv_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                config.fmt, tiles.threads // 32, config.varlen, config.window,
                                config.softcap, config.alibi)

    def samples(self):
        return _samples("dkdv", 1)

    def grid(self, config, tiles, p):
        b, _, hk, _ = p["k"].shape
        return (b * hk, -(-grid_lengths(p)[1] // tiles.BLOCK_N))


class Dq(DqSpec):
    name = "flash_bwd_dq_tc"
    unroll_loops = True

    def entry(self, config, device):
        return _entry(config, device, 2, lambda e: self.tiles(config, e).shared_bytes)

    def tiles(self, config, entry):
        bm, bn, warps = entry
        return Tiles(bm, bn, 32 * warps, dq_shared_layout(bm, bn, config.head_dim).bytes)

    def make(self, config, tiles):
        return make_dq_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                              config.fmt, tiles.threads // 32, config.varlen, config.window,
                              config.softcap, config.alibi)

    def samples(self):
        return _samples("dq", 2)

    def grid(self, config, tiles, p):
        b, _, hq, _ = p["q"].shape
        return (b * hq, -(-grid_lengths(p)[0] // tiles.BLOCK_M))


DKDV, DQ = Dkdv(), Dq()
