"""FlashAttention backward on Hopper's warpgroup tensor cores: FA2's two kernels on ``wgmma``.

What it computes
    The gradients of ``tc/backward_mma.py`` (read it first: the recomputation from lse, D_i, the
    causal rules and the fixed summation order are the same), with every product issued as
    ``wgmma.mma_async`` (``ptx/wgmma.py``; ``tc/forward_wgmma.py`` explains the accumulator and
    operand layouts). A warpgroup multiplies its 64 rows by a whole tile of the other side in one
    chain of asynchronous instructions that read both operands from shared memory, where
    ``mma.sync`` made each warp pull every fragment through its own registers:

        dK/dV (keys are the 64 rows):   S^T = K_j Q_i^T        dP^T = V_j dO_i^T        (ss)
                                        dV_j += P^T dO_i       dK_j += dS^T Q_i         (rs)
        dQ (queries are the 64 rows):   S = Q_i K_j^T          dP = dO_i V_j^T          (ss)
                                        dQ_i += dS K_j                                  (rs)

    with ``P = exp2(S scale_log2 - lse_i log2 e)`` and ``dS = P (dP - D_i)`` computed in the
    accumulator registers in between, and P^T, dS^T (P, dS) rounded to 16 bits as the register
    A operand of the next products. No atomics: each output element is written by one CTA, once,
    and dK/dV sums the query heads of its kv head's group in a fixed order, so the gradients are
    bitwise reproducible.

    The preprocess ``D_i = rowsum(dO_i * O_i)`` is no kernel of its own here: the dQ kernel
    copies O_i beside dO_i, sums the products of its rows from shared memory while the tensor
    cores run its first products (``common/backward.make_tile_delta``), uses them and writes
    them to ``delta``; dQ therefore runs first and dK/dV reads them (``DqDeltaSpec``). That
    saves a launch and a pass over O and dO: 83-95 us of a 1.6-1.9 ms backward at N = 1k.

Grid / block mapping
    dK/dV: grid (ceil(Sk / BLOCK_N), B * Hk) with B * Hk folded into y and z
    (``common/grid.py``); BLOCK_N = 64 NWG keys, warpgroup ``wg`` owns keys ``64 wg .. 64 wg +
    63`` and streams BLOCK_M queries per step. dQ: grid (ceil(Sq / BLOCK_M), B * Hq), causal
    query tiles from the last; BLOCK_M = 64 NWG queries, BLOCK_N keys per step. Per thread, in
    registers: the two ss accumulators (BLOCK / 2 floats each) and the rs ones (DPAD / 2 floats
    each: dK and dV, or dQ).

Memory pipeline
    cp.async 16-byte copies into 128-byte-swizzled tiles (``common/copies.py``), published to
    wgmma by wait -> proxy fence -> barrier as in the forward. dK/dV: K_j, V_j once; Q_i, dO_i
    double buffered with lse_i log2 e and D_i beside them, tile i + 1 in flight while tile i is
    computed. dQ: Q_i, dO_i (and O_i, for D_i) once; K_j, V_j double buffered. The next tile's
    copies (and, in dK/dV, its lse_i and D_i, staged into the other words) are issued after the
    current tile's first products, so their issue and latency run under the tensor cores' work
    instead of between the barrier and the first wgmma. At the end dQ (or dK and dV) is staged,
    rounded to 16 bits, over the Q (or K and V) tile and written as whole 16-byte chunks of rows
    (``common/epilogue.make_row_writer``).

Shared memory (16-bit elements, DPAD = HEAD_DIM rounded up to 64, + 1 KiB of alignment)
    dK/dV: K, V  BLOCK_N x DPAD each; Q, dO  2 x BLOCK_M x DPAD each; 4 BLOCK_M float32.
    dQ:    Q, dO, O  BLOCK_M x DPAD each; K, V  2 x BLOCK_N x DPAD each.
    e.g. D = 128, dK/dV 128 keys x 64 queries: 64 + 64 + 1 + 1 = 130 KiB; dQ 128 x 64: 161 KiB.
    One or two blocks per SM: the tiles run 4 or 8 warps at 128-255 registers per thread (the
    table may cap them so that two blocks fit).

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 8 up to 128 (dK and dV of a 64-key warpgroup are
    DPAD floats per thread: at 256 they would not fit the registers, and ``tc`` runs
    ``backward_mma.py`` there); any Sq, Sk; q, k, v, dout with 16-byte aligned rows (the host
    checks); compute capability 9.0 (sm_90a).
    Dense batches, or packed varlen sequences (``VARLEN``): each CTA takes its sequence's
    rows from ``common/masks.make_seqlen_info`` and returns when its tile lies past the
    sequence's end (kernels/attention.py). Masks and score modifiers: the compile-time
    ``WINDOW``, ``SOFTCAP`` and ``ALIBI`` of ``simt/backward.py``, through the same pieces
    (``common/masks.py``, ``common/backward.py``, ``common/score_mods.py``). A softcap takes
    registers beside the 64-row accumulators: at D <= 64 the dK/dV kernel then holds 64 keys
    per CTA (``SOFTCAP_DKDV``; the 128-key tile spills 4-140 bytes), and varlen batches with a
    softcap run on ``backward_mma.py`` (8-88 bytes here: registry.py).
"""

from functools import lru_cache

from numba import cuda, float32, int32, uint16, uint32, uint64

from ...runtime.spec import SM90A, Tiles
from ..attention import HALF_FORMATS, DkdvSpec, DqDeltaSpec, sample
from ..common import backward
from ..common.copies import make_swizzled_copy
from ..common.epilogue import make_row_writer
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import (make_key_view, make_kv_end, make_q_begin, make_seqlen_info,
                            make_window)
from ..common.score_mods import make_score_mods
from ..instructions import convert, memory, sync, wgmma

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
WARPGROUP = wgmma.WARPGROUP
MAX_HEAD_DIM = 128


def dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The dK/dV kernel's tiles, in 16-bit elements from the aligned base: K, V, the Q and dO
    double buffers, lse_i log2 e and D_i of each buffer (4 BLOCK_M float32); the epilogue stages
    dK and dV over K and V."""
    dpad = wgmma.padded_cols(HEAD_DIM)
    return SharedLayout(2, [("k", BLOCK_N * dpad), ("v", BLOCK_N * dpad),
                            ("q", 2 * BLOCK_M * dpad), ("do", 2 * BLOCK_M * dpad),
                            ("rows", 2 * 4 * BLOCK_M), ("dk", BLOCK_N * dpad, "k"),
                            ("dv", BLOCK_N * dpad, "v")], reserve=wgmma.TILE_ALIGN)


def dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The dQ kernel's tiles, in 16-bit elements from the aligned base: Q, dO, the K and V
    double buffers, O (for D_i); the epilogue stages dQ over Q."""
    dpad = wgmma.padded_cols(HEAD_DIM)
    return SharedLayout(2, [("q", BLOCK_M * dpad), ("do", BLOCK_M * dpad),
                            ("k", 2 * BLOCK_N * dpad), ("v", 2 * BLOCK_N * dpad),
                            ("o", BLOCK_M * dpad), ("dq", BLOCK_M * dpad, "q")],
                        reserve=wgmma.TILE_ALIGN)


@lru_cache(maxsize=None)
def make_pack_a(FMT):
    """``pack_a(C, kk)``: columns ``16 kk .. 16 kk + 15`` of accumulator C rounded to 16 bits,
    the A operand of an rs wgmma (the accumulator and A-fragment layouts line up)."""
    pack = convert.pack(FMT)

    @cuda.jit(device=True, inline="always")
    def pack_a(C, kk):
        return (pack(C[2 * kk, 0], C[2 * kk, 1]), pack(C[2 * kk, 2], C[2 * kk, 3]),
                pack(C[2 * kk + 1, 0], C[2 * kk + 1, 1]),
                pack(C[2 * kk + 1, 2], C[2 * kk + 1, 3]))

    return pack_a


@lru_cache(maxsize=None)
def make_dkdv_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False,
                     WINDOW=False, SOFTCAP=False, ALIBI=False):
    """Kernel 1: dK_j, dV_j of BLOCK_N = 64 NWG keys of one (batch, kv head)."""
    assert FMT in ("float16", "bfloat16") and BLOCK_N % 64 == 0 and BLOCK_M % 16 == 0
    THREADS = BLOCK_N // 64 * WARPGROUP
    DPAD = wgmma.padded_cols(HEAD_DIM)
    KSTEPS, MT, DT = DPAD // 16, BLOCK_M // 8, DPAD // 8
    S_REGS, D_REGS = 4 * MT, 4 * DT
    lay = dkdv_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    K_OFF, V_OFF, Q_OFF, DO_OFF = lay.k, lay.v, lay.q, lay.do
    DK_OFF, DV_OFF = lay.dk, lay.dv
    TILE = BLOCK_M * DPAD                    # elements of one Q (or dO) buffer
    ROWS_OFF = lay.rows // 2                 # float32 words: lse_i log2 e, D_i per buffer
    SCRATCH = wgmma.scratch_size(THREADS)
    mma_t = wgmma.mma_ss(FMT, BLOCK_M, 0)    # S^T = K Q^T, dP^T = V dO^T: Q, dO read K-major
    mma_g = wgmma.mma_rs(FMT, DPAD, 1)       # dV += P^T dO, dK += dS^T Q: dO, Q read MN-major
    pack_a = make_pack_a(FMT)
    copy_slot, copy_tile, _ = make_swizzled_copy(HEAD_DIM, DPAD, THREADS)
    pack = convert.pack(FMT)
    write_rows = make_row_writer(HEAD_DIM, BLOCK_N)
    seqlen_info = make_seqlen_info(VARLEN)
    q_begin = make_q_begin(BLOCK_M, CAUSAL)
    stage_rows = backward.make_dkdv_rows(BLOCK_M, THREADS)
    scores_to_ds = backward.make_dkdv_scores_to_ds(MT, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                                                 SOFTCAP, ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    query_window = make_window(BLOCK_M, BLOCK_N, WINDOW)[1]
    ZERO = float32(0.0)
    SBO, MN_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    QT_LBO = BLOCK_M * wgmma.SWIZZLE_BYTES   # Q, dO as MN-major B: 64-column blocks apart
    BUF_STEP = TILE * 2 // 16                # one Q (dO) buffer in descriptor units

    def flash_bwd_dkdv_wgmma(q, k, v, dout, lse, delta, dk, dv, seqlen_q, seqlen_k, n_heads_k,
                             group, scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             status, window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)  # the same bytes
        words_u = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # ... again
        scratch = cuda.shared.array(SCRATCH, uint32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        r0, c = copy_slot(tid)
        base = wgmma.aligned_base(smem)
        rows0 = base // 2 + ROWS_OFF
        bh = folded_row()
        if bh >= k.shape[0] * n_heads_k:
            return  # past the last (batch, head): see common/grid.py
        b = int32(convert.div_u32(bh, n_heads_k))
        hk = bh - b * n_heads_k
        n0 = cuda.blockIdx.x * BLOCK_N
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

        copy_tile(smem, base + K_OFF, k, b, n0, hk, BLOCK_N, seqlen_k, r0, c)
        copy_tile(smem, base + V_OFF, v, b, n0, hk, BLOCK_N, seqlen_k, r0, c)
        if steps > 0:
            copy_tile(smem, base + Q_OFF, q, b, m_begin, hk * group, BLOCK_M, seqlen_q, r0, c)
            copy_tile(smem, base + DO_OFF, dout, b, m_begin, hk * group, BLOCK_M, seqlen_q, r0, c)
        memory.cp_async_commit()

        # This warpgroup's 64 keys of K and V as the A operand; Q and dO of buffer 0 as B.
        keys = (tid >> 7) * 64 * wgmma.BLOCK_COLS
        desc_k = wgmma.descriptor(smem, base + K_OFF + keys, 16, SBO)
        desc_v = wgmma.descriptor(smem, base + V_OFF + keys, 16, SBO)
        desc_q = wgmma.descriptor(smem, base + Q_OFF, 16, SBO)
        desc_do = wgmma.descriptor(smem, base + DO_OFF, 16, SBO)
        desc_qt = wgmma.descriptor(smem, base + Q_OFF, QT_LBO, SBO)
        desc_dot = wgmma.descriptor(smem, base + DO_OFF, QT_LBO, SBO)

        dK = cuda.local.array((DT, 4), float32)
        dV = cuda.local.array((DT, 4), float32)
        S = cuda.local.array((MT, 4), float32)   # S^T, then P^T
        dP = cuda.local.array((MT, 4), float32)  # dP^T, then dS^T
        for dt in range(DT):
            for e in range(4):
                dK[dt, e] = ZERO
                dV[dt, e] = ZERO
        key_g = n0 + 16 * warp + g  # the key of this thread's fragment rows (and + 8)

        h, m0 = hk * group, m_begin  # the (query head, query tile) of this step
        # lse_i log2 e and D_i of the first tile (+inf, 0 past the queries: P = 0 there).
        stage_rows(words, rows0, lse, delta, b, h, m0, seqlen_q, tid)
        for step in range(steps):
            rows = rows0 + (step & 1) * 2 * BLOCK_M
            memory.cp_async_wait(0)  # tile i (and K, V) landed ...
            sync.proxy_fence()       # ... is visible to wgmma reads ...
            cuda.syncthreads()       # ... for every thread; every warpgroup is done with i - 1
            nh, nm = h, m0 + BLOCK_M  # the next step: the next query tile, or the next head's
            if nm >= seqlen_q:
                nh, nm = h + 1, m_begin
            nxt = TILE - (step & 1) * TILE
            buf = uint64((step & 1) * BUF_STEP)

            # S^T = K_j Q_i^T and dP^T = V_j dO_i^T: one batch of two chains.
            wgmma.fence()
            for ks in range(KSTEPS):
                mma_t(S, 0, desc_k + k_step(ks, BLOCK_N), desc_q + buf + k_step(ks, BLOCK_M),
                      ks > 0, smem, scratch, tid)
            # Tile i + 1 into the buffers tile i - 1 left (every warpgroup passed the barrier
            # after its last product on them), and its rows' lse and D_i into the words tile
            # i - 1 left, issued while the tensor cores run tile i's products: neither latency
            # is waited on. (Between the two chains: the dP accumulators are not live yet.)
            if step + 1 < steps:
                copy_tile(smem, base + Q_OFF + nxt, q, b, nm, nh, BLOCK_M, seqlen_q, r0, c)
                copy_tile(smem, base + DO_OFF + nxt, dout, b, nm, nh, BLOCK_M, seqlen_q, r0, c)
                memory.cp_async_commit()
                stage_rows(words, rows0 + 2 * BLOCK_M - (step & 1) * 2 * BLOCK_M, lse, delta,
                           b, nh, nm, seqlen_q, tid)
            for ks in range(KSTEPS):
                mma_t(dP, 0, desc_v + k_step(ks, BLOCK_N), desc_do + buf + k_step(ks, BLOCK_M),
                      ks > 0, smem, scratch, tid)
            wgmma.commit()
            wgmma.wait(0)
            wgmma.fence_operands(S, S_REGS)
            wgmma.fence_operands(dP, S_REGS)

            # P^T = exp2(S^T scale_log2 - lse_i log2 e), masked above the causal diagonal;
            # dS^T = P^T (dP^T - D_i). Element (mt, e): key key_g + 8 (e >> 1), query
            # m0 + t2 + 8 mt + (e & 1).
            mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
            scores_to_ds(S, dP, words, rows, m0, n0, key_g, t2, diag, diag_lo, scale_log2,
                         mods)

            # dV_j += P^T dO_i and dK_j += dS^T Q_i, 16 queries per wgmma.
            wgmma.fence()
            for kk in range(MT // 2):
                mma_g(dV, 0, pack_a(S, kk), desc_dot + buf + uint64(kk * MN_STEP), 1,
                      smem, scratch, tid)
            for kk in range(MT // 2):
                mma_g(dK, 0, pack_a(dP, kk), desc_qt + buf + uint64(kk * MN_STEP), 1,
                      smem, scratch, tid)
            wgmma.commit()
            wgmma.wait(0)
            wgmma.fence_operands(dV, D_REGS)
            wgmma.fence_operands(dK, D_REGS)
            h, m0 = nh, nm

        # Epilogue: dK_j scale and dV_j staged over K_j and V_j, which no product reads any
        # more, then written as whole 16-byte chunks of rows (common/epilogue.py).
        memory.cp_async_wait(0)  # K, V (and nothing else) where no query tile waited
        cuda.syncthreads()       # every warpgroup's products on K_j, V_j are done
        for half in range(2):
            row = 16 * warp + g + 8 * half
            for dt in range(DT):
                at = wgmma.tile_offset(row, 8 * dt + t2, BLOCK_N)
                words_u[uint32(base + DK_OFF + at) >> 1] = pack(dK[dt, 2 * half] * scale,
                                                                dK[dt, 2 * half + 1] * scale)
                words_u[uint32(base + DV_OFF + at) >> 1] = pack(dV[dt, 2 * half],
                                                                dV[dt, 2 * half + 1])
        cuda.syncthreads()  # a warp reads only its own rows; the simulator has no syncwarp
        write_rows(dk, b, n0 + 16 * warp, hk, seqlen_k, smem, base + DK_OFF, 16 * warp, lane)
        write_rows(dv, b, n0 + 16 * warp, hk, seqlen_k, smem, base + DV_OFF, 16 * warp, lane)

    return flash_bwd_dkdv_wgmma


@lru_cache(maxsize=None)
def make_dq_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False,
                   WINDOW=False, SOFTCAP=False, ALIBI=False):
    """Kernel 2: dQ_i of BLOCK_M = 64 NWG queries of one (batch, query head)."""
    assert FMT in ("float16", "bfloat16") and BLOCK_M % 64 == 0 and BLOCK_N % 16 == 0
    THREADS = BLOCK_M // 64 * WARPGROUP
    DPAD = wgmma.padded_cols(HEAD_DIM)
    KSTEPS, NT, DT = DPAD // 16, BLOCK_N // 8, DPAD // 8
    S_REGS, D_REGS = 4 * NT, 4 * DT
    lay = dq_shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    Q_OFF, DO_OFF, K_OFF, V_OFF, O_OFF, DQ_OFF = lay.q, lay.do, lay.k, lay.v, lay.o, lay.dq
    TILE = BLOCK_N * DPAD                    # elements of one K (or V) buffer
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(FMT, BLOCK_N, 0)    # S = Q K^T, dP = dO V^T: K, V read K-major
    mma_q = wgmma.mma_rs(FMT, DPAD, 1)       # dQ += dS K: K read MN-major
    pack_a = make_pack_a(FMT)
    copy_slot, copy_tile, _ = make_swizzled_copy(HEAD_DIM, DPAD, THREADS)
    pack = convert.pack(FMT)
    write_rows = make_row_writer(HEAD_DIM, BLOCK_M)
    seqlen_info = make_seqlen_info(VARLEN)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    load_rows = backward.make_dq_rows(WITH_DELTA=False)
    tile_delta = backward.make_tile_delta(DPAD, BLOCK_M, FMT)
    scores_to_ds = backward.make_dq_scores_to_ds(NT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW,
                                                 SOFTCAP, ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW)
    ZERO = float32(0.0)
    SBO, MN_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    K_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES    # K as MN-major B: 64-column blocks apart
    BUF_STEP = TILE * 2 // 16

    def flash_bwd_dq_wgmma(q, k, v, dout, out, lse, delta, dq, seqlen_q, seqlen_k, n_heads_q,
                           group, scale, scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k,
                           status, window_left, window_right, softcap, alibi_slopes):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        r0, c = copy_slot(tid)
        base = wgmma.aligned_base(smem)
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        b = int32(convert.div_u32(bh, n_heads_q))
        h = bh - b * n_heads_q
        hk = int32(convert.div_u32(h, group))
        # Causal: the longest query tiles first (the grid's last CTAs are then the short ones).
        m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x) * BLOCK_M
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            # Bounds read from memory are not warp-uniform to ptxas, which then serializes the
            # wgmma of every branch and loop they decide (C7519): broadcast, they are.
            seqlen_q, seqlen_k = sync.warp_uniform(seqlen_q), sync.warp_uniform(seqlen_k)
            diag = seqlen_k - seqlen_q
            if m0 >= seqlen_q:
                return  # a query tile past the sequence's end
            q, dout, out, dq = q[:, q0:], dout[:, q0:], out[:, q0:], dq[:, q0:]
            lse, delta = lse[:, :, q0:], delta[:, :, q0:]
            k, v = k[:, k0:], v[:, k0:]
        # Sliding window: keys from the first tile it reaches, diagonals relative to it.
        k, v, _, seqlen_k, rel0, diag, diag_lo = key_view(k, v, status, m0, diag, seqlen_k,
                                                          window_left, window_right)
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
        end = kv_end(m0, diag, seqlen_k)
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0

        copy_tile(smem, base + Q_OFF, q, b, m0, h, BLOCK_M, seqlen_q, r0, c)
        copy_tile(smem, base + DO_OFF, dout, b, m0, h, BLOCK_M, seqlen_q, r0, c)
        if n_tiles > 0:
            copy_tile(smem, base + O_OFF, out, b, m0, h, BLOCK_M, seqlen_q, r0, c)
            copy_tile(smem, base + K_OFF, k, b, 0, hk, BLOCK_N, seqlen_k, r0, c)
            copy_tile(smem, base + V_OFF, v, b, 0, hk, BLOCK_N, seqlen_k, r0, c)
        memory.cp_async_commit()

        # This warpgroup's 64 rows of Q and dO as the A operand; K and V of buffer 0 as B.
        rows = (tid >> 7) * 64 * wgmma.BLOCK_COLS
        desc_q = wgmma.descriptor(smem, base + Q_OFF + rows, 16, SBO)
        desc_do = wgmma.descriptor(smem, base + DO_OFF + rows, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO)
        desc_v = wgmma.descriptor(smem, base + V_OFF, 16, SBO)
        desc_kt = wgmma.descriptor(smem, base + K_OFF, K_LBO, SBO)

        dQ = cuda.local.array((DT, 4), float32)
        S = cuda.local.array((NT, 4), float32)   # S, then P
        dP = cuda.local.array((NT, 4), float32)  # dP, then dS
        for dt in range(DT):
            for e in range(4):
                dQ[dt, e] = ZERO
        row_g = m0 + 16 * warp + g  # this thread's fragment rows: row_g and row_g + 8
        lse_r = cuda.local.array(2, float32)  # lse_i log2 e and D_i of the two rows
        D_r = cuda.local.array(2, float32)    # 0 until tile 0 computes it (kept where no key)
        load_rows(lse_r, D_r, lse, delta, b, h, row_g, seqlen_q)

        for j in range(n_tiles):
            n0 = j * BLOCK_N
            memory.cp_async_wait(0)
            sync.proxy_fence()
            cuda.syncthreads()
            nxt = TILE - (j & 1) * TILE
            buf = uint64((j & 1) * BUF_STEP)

            # S = Q_i K_j^T and dP = dO_i V_j^T: one batch of two chains.
            wgmma.fence()
            for ks in range(KSTEPS):
                mma_s(S, 0, desc_q + k_step(ks, BLOCK_M), desc_k + buf + k_step(ks, BLOCK_N),
                      ks > 0, smem, scratch, tid)
            for ks in range(KSTEPS):
                mma_s(dP, 0, desc_do + k_step(ks, BLOCK_M), desc_v + buf + k_step(ks, BLOCK_N),
                      ks > 0, smem, scratch, tid)
            wgmma.commit()
            # Tile j + 1 into the buffers tile j - 1 left, under tile j's products.
            if j + 1 < n_tiles:
                copy_tile(smem, base + K_OFF + nxt, k, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                          r0, c)
                copy_tile(smem, base + V_OFF + nxt, v, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                          r0, c)
                memory.cp_async_commit()
            # The preprocess, fused: D_i = rowsum(dO_i O_i) of this thread's rows from the
            # shared O_i and dO_i, also under the first products (dK/dV, launched after this
            # kernel, reads them from delta).
            if j == 0:
                tile_delta(D_r, words, base + O_OFF, base + DO_OFF, row_g - m0, lane & 3,
                           shfl_scratch, tid)
            wgmma.wait(0)
            wgmma.fence_operands(S, S_REGS)
            wgmma.fence_operands(dP, S_REGS)

            # P = exp2(S scale_log2 - lse_i log2 e), masked past the keys and the diagonal;
            # dS = P (dP - D_i). Element (nt, e): row row_g + 8 (e >> 1), key n0 + t2 + 8 nt
            # + (e & 1).
            scores_to_ds(S, dP, lse_r, D_r, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                         scale_log2, mods)

            # dQ_i += dS K_j, 16 keys per wgmma.
            wgmma.fence()
            for kk in range(NT // 2):
                mma_q(dQ, 0, pack_a(dP, kk), desc_kt + buf + uint64(kk * MN_STEP), 1,
                      smem, scratch, tid)
            wgmma.commit()
            wgmma.wait(0)
            wgmma.fence_operands(dQ, D_REGS)

        # Epilogue: dQ_i scale staged over Q_i, which no product reads any more, then written
        # as whole 16-byte chunks of rows (common/epilogue.py); D_i for dK/dV, 0 in a tile that
        # sees no key (its lse is +inf: P = 0 anyway).
        memory.cp_async_wait(0)  # Q, dO (and nothing else) where no key tile waited
        cuda.syncthreads()       # every warpgroup's products on Q_i are done
        for half in range(2):
            row = 16 * warp + g + 8 * half
            for dt in range(DT):
                words[uint32(base + DQ_OFF + wgmma.tile_offset(row, 8 * dt + t2, BLOCK_M)) >> 1] = \
                    pack(dQ[dt, 2 * half] * scale, dQ[dt, 2 * half + 1] * scale)
            if t2 == 0 and row_g + 8 * half < seqlen_q:
                delta[b, h, row_g + 8 * half] = D_r[half]
        cuda.syncthreads()  # a warp reads only its own rows; the simulator has no syncwarp
        write_rows(dq, b, m0 + 16 * warp, h, seqlen_q, smem, base + DQ_OFF, 16 * warp, lane)

    return flash_bwd_dq_wgmma


# ----------------------------------------------------------------------------- specs

# (BLOCK_M, BLOCK_N) by head dim, non-causal and causal; dK/dV holds BLOCK_N = 64 NWG keys and
# streams BLOCK_M queries, dQ holds BLOCK_M = 64 NWG queries and streams BLOCK_N keys. Measured
# by bench/tune_tc_backward.py --family wgmma on an H200 at N = 4096, fp16 (ms per kernel,
# bench/results/NVIDIA-H200/tune_tc_backward_wgmma.csv):
#   dK/dV D = 64:  128 x 128: 5.51 / 3.04 (non-causal / causal) against 5.95 / 3.31 for 128 x 64
#                  and 6.06 / 3.30 for 64 x 64 (255 registers, no spill);
#   dK/dV D = 128: 64 x 128: 5.12 non-causal (64 x 64: 5.32); 64 x 64: 2.80 causal (64 x 128:
#                  2.85); 128 x 64 spills;
#   dQ D = 64:     128 x 64: 3.41 non-causal (128 x 128: 3.61); 128 x 128: 2.04 causal;
#   dQ D = 128:    128 x 64: 3.27 / 1.90 against 3.38 / 2.09 for 128 x 32.
# An optional third number caps the registers per thread: dQ D = 64 non-causal holds two CTAs
# per SM at 128 (without the cap, the fused D_i step takes it to 156 and one CTA: 5% slower).
TILES = ((64, ((128, 128), (128, 128)), ((128, 64, 128), (128, 128))),
         (128, ((64, 128), (64, 64)), ((128, 64), (128, 64))))


# The dK/dV tile under a softcap at D <= 64: 64 keys, one warpgroup (its cap's tanh and
# derivative spill the 128-key tile's registers; spill-free here with window and ALiBi too).
SOFTCAP_DKDV = (64, 128)


def _entry(config, column):
    """The table's tiles for ``config``; varlen kernels without the register cap (the bounds
    they compute take the few registers more that would spill under it)."""
    if config.softcap and column == 1 and config.head_dim <= 64:
        return SOFTCAP_DKDV
    entry = next(t for t in TILES if config.head_dim <= t[0])[column][int(config.causal)]
    return entry[:2] if config.varlen else entry


def _samples(kernel, column):
    """Every entry of the table, causal or not, in both formats, each without its register cap
    (the PTX record keys the dQ entry of D = 64 from before its cap); varlen at head dim 128
    with the table's entry; a sliding window at head dim 128, dense and varlen; ALiBi at 128;
    a softcap at 64 (with window and ALiBi) and 128 (dense: varlen ones run on the mma.sync
    pair)."""
    return [sample(f"tc wgmma bwd {kernel}", (row[0], causal, fmt), row[column][int(causal)][:2],
                   ccs=(SM90A,))
            for row in TILES for causal in (False, True) for fmt in HALF_FORMATS] + [
                sample(f"tc wgmma bwd {kernel}", (128, True, "bfloat16", True), ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}", (128, True, "float16", False, False, True),
                       ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}", (128, True, "bfloat16", True, False, True),
                       ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}",
                       (128, True, "bfloat16", False, False, False, False, True), ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}", (64, True, "bfloat16", False, False, True, True,
                                                  True), ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}", (64, False, "float16", False, False, False,
                                                  True), ccs=(SM90A,)),
                sample(f"tc wgmma bwd {kernel}", (128, False, "bfloat16", False, False, False,
                                                  True), ccs=(SM90A,))]


def _tiles(entry, threads_of, shared_layout, head_dim):
    bm, bn, regs = (*entry, 0)[:3]
    return Tiles(bm, bn, threads_of(bm, bn), shared_layout(bm, bn, head_dim).bytes, regs)


class Dkdv(DkdvSpec):
    name = "flash_bwd_dkdv_wgmma"
    unroll_loops = True

    def entry(self, config, device):
        return _entry(config, 1)

    def tiles(self, config, entry):
        return _tiles(entry, lambda bm, bn: bn // 64 * WARPGROUP, dkdv_shared_layout,
                      config.head_dim)

    def make(self, config, tiles):
        return make_dkdv_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                config.fmt, config.varlen, config.window,
                                config.softcap, config.alibi)

    def samples(self):
        return _samples("dkdv", 1)


class Dq(DqDeltaSpec):
    name = "flash_bwd_dq_wgmma"
    unroll_loops = True

    def entry(self, config, device):
        return _entry(config, 2)

    def tiles(self, config, entry):
        return _tiles(entry, lambda bm, bn: bm // 64 * WARPGROUP, dq_shared_layout,
                      config.head_dim)

    def make(self, config, tiles):
        return make_dq_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                              config.fmt, config.varlen, config.window,
                              config.softcap, config.alibi)

    def samples(self):
        return _samples("dq", 2)


DKDV, DQ = Dkdv(), Dq()
