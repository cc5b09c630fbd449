"""Paged MLA decode on Ampere / Ada tensor cores (``mma.sync``): the sm_80-sm_89 tc decode.

What it computes
    The function of ``simt/mla_decode.py`` and ``tc/mla_decode_wgmma.py`` (read their docstrings
    first: the packed query rows, the scheduler's pieces, split-KV partials, the combine and the
    paged-KV walk of ``common/paged_kv.py`` are the same), with both products as
    ``mma.sync.m16n8k16`` fed by ``ldmatrix``, the way ``tc/forward_mma.py`` does. The ``s_q *
    h_q / h_kv`` query rows of a KV head are M, in tiles of BLOCK_M rows (a ragged last tile is
    padded with zero rows, never stored); Q stays in shared memory for a whole piece, and each
    cache tile of BLOCK_N rows gathered through the block table serves as K for ``S = Q K^T``
    over all HEAD_DIM columns and, through its first HEAD_DIM_V columns, as V for ``O += P V``:
    the cache is read once per BLOCK_M query rows.

Grid / block mapping
    grid = (scheduler parts, h_kv, ceil(q_rows / BLOCK_M)); block = SLABS x COLS warps (SLABS =
    BLOCK_M / 16 row slabs, COLS column groups). O_i (BLOCK_M x HEAD_DIM_V) is too large for one
    warp per 16 rows (512 columns: 256 floats per thread; with two warps per slab, 128 floats,
    ptxas spills), so warp ``w`` owns rows ``16 slab ..`` (slab = w % SLABS) and O_i columns
    ``VH grp ..`` (grp = w // SLABS; VH = HEAD_DIM_V / COLS rounded up to 16: 128 columns, 64
    accumulator floats per thread at COLS = 4). Computing S once per warp would cost COLS times
    the tensor work, so, as in the wgmma kernel, the warps of a slab split S by keys: warp (slab,
    grp) computes the 16 x KEYS block of keys ``KEYS grp ..`` of every tile (KEYS = BLOCK_N /
    COLS = 8), and one row of the online softmax lives in COLS warps:

        1. each computes its block of S and the row maxima over its KEYS keys (quad shuffles);
        2. the maxima cross through shared memory (a barrier): all take the max of the COLS,
           so all move m_i, rescale their columns of O_i and compute P with the same numbers;
        3. each writes its block of P (16 bits) to a shared BLOCK_M x BLOCK_N P tile (a barrier);
        4. each multiplies its slab's 16 rows of P (ldmatrix, the A operand) by its V columns
           (ldmatrix.trans, the B operand): O_i[:, own] += P V[:, own].

    l_i is summed per warp over its own keys (the warps share every m_i, so the partial sums
    have one scale) and added up once per piece. Per thread, in registers: 4 KEYS / 8 floats of
    S/P, VH / 2 of O_i, and m_i, l_i of its two rows (the C-fragment layout of
    ``forward_mma.py``: lane ``g = lane / 4`` holds rows ``16 slab + g`` and ``+ 8``). The
    epilogue stages O_i / l_i in shared memory, one column group at a time, and stores it along
    rows (consecutive threads, consecutive columns).

Memory pipeline
    Threads ``TPR r .. TPR r + TPR - 1`` (TPR = threads / BLOCK_N) copy cache row ``r`` of each
    tile in 16-byte ``cp.async`` chunks (``paged_kv``'s ``copy_row``: zero-filled for rows past
    the piece end or that the block table cannot place), double buffered: tile j + 1 is in
    flight while tile j is multiplied, and its block-table entry was read one tile earlier
    still. Q is copied the same way with the first tile of each piece. One barrier per tile
    publishes tile j and frees the buffer of tile j - 1.

Shared memory (16-bit elements; rows padded by 8 elements, as in forward_mma.py, so the 8 row
addresses of an ldmatrix fall in 8 different 16-byte bank groups)
    Q   BLOCK_M x STRIDE          STRIDE = max(HEAD_DIM, COLS VH) + 8
    K   2 x BLOCK_N x STRIDE      double buffer; V is its first COLS VH columns
    P   BLOCK_M x (BLOCK_N + 8)
    + COLS BLOCK_M floats (static) for the exchange of row maxima and sums. The tile table
    (``TILES``) takes the first entry that fits the device's block. HEAD_DIM 576, HEAD_DIM_V
    512: BLOCK_M 32 x BLOCK_N 32 (8 warps) needs 112 KiB, which an A100 (sm_80, 163 KiB)
    gives; sm_86 / sm_89 (99 KiB) take BLOCK_M 16 (4 warps, 93 KiB). Two 32-key cache tiles
    alone are 73 KiB (BLOCK_N = 8 COLS: each warp's keys are one n8 block of S); more query
    rows per CTA would need more warps than the register file allows (64 rows: 16 warps of at
    most 128 registers) or more O columns per warp (two groups: 128 accumulators, which spill).

Sparse decode (DeepSeek-V3.2's ``indices``)
    ``SPARSE`` looks each row up in the request's packed cache rows (``paged_kv``'s walk);
    V3.2's FP8 rows (``CACHE = "v32"``) land through ``paged_kv.make_row_copy`` and are widened
    by ``make_row_widen`` after the thread's cp.async wait, before the tile's barrier (the
    e4m3 conversions need sm_89).

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 16 up to 576, HEAD_DIM_V up to 512; q and the
    cache 16-byte aligned rows (the API sends other views to the simt kernel); any page size;
    compute capability 8.0 or newer (the tc decode everywhere but on 9.0, which runs the wgmma
    kernel). No table entry, length or metadata value can move a copy or a store outside its
    array (``common/paged_kv.py``).
"""

from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32

from ...runtime.spec import SM80, Sample, Tiles
from ..attention import TC_DECODE_SAMPLES, DecodeConfig, DecodeSpec, tensor_type
from ..common.layout import SharedLayout
from ..common.paged_kv import (SCHED_BLOCK, make_paged_kv_walk, make_row_copy, make_row_keys,
                               make_row_widen)
from ..common.softmax import make_online_update, make_row_max
from ..instructions import convert, memory, sync
from ..instructions import mma as mma_sync

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
PAD = 8  # elements of row padding in shared memory (16 bytes)
MAX_HEAD_DIM, MAX_HEAD_DIM_V = 576, 512

# (BLOCK_M, BLOCK_N, COLS, register cap), the first that fits the device's block is taken:
# BLOCK_M / 16 x COLS warps. BLOCK_N divides SCHED_BLOCK (a tile never straddles two pieces).
# Every entry compiles for sm_80 without spills (the PTX test checks it); ptxas takes up to 255
# registers at HEAD_DIM 576 (one CTA per SM at these shared sizes), so no cap.
TILES = ((32, 32, 4, 0), (16, 32, 4, 0))


def value_cols(head_dim_v, cols):
    """O_i columns per warp: HEAD_DIM_V / COLS rounded up to 16 (an ldmatrix.x4.trans of V)."""
    return -(-head_dim_v // (16 * cols)) * 16


def supports(head_dim, head_dim_v):
    """Whether this kernel takes the head dims (other ones run the simt decode)."""
    return head_dim % 16 == 0 and head_dim <= MAX_HEAD_DIM and head_dim_v <= MAX_HEAD_DIM_V


def row_stride(head_dim, head_dim_v, cols):
    """Elements between rows of the Q and cache tiles."""
    return max(head_dim, cols * value_cols(head_dim_v, cols)) + PAD


def stage_stride(head_dim_v, cols):
    """Floats per staged output row of the epilogue (4 more than VH: fewer bank conflicts)."""
    return value_cols(head_dim_v, cols) + 4


def shared_layout(block_m, block_n, cols, head_dim, head_dim_v):
    """The CTA's dynamic shared memory: Q, the two cache tiles, P (rows of ``row_stride`` and
    BLOCK_N + PAD elements), and the epilogue's staged O_i columns (float32) over Q and K."""
    stride = row_stride(head_dim, head_dim_v, cols)
    stage = block_m * stage_stride(head_dim_v, cols) * 2  # float32 words in 16-bit elements
    return SharedLayout(2, [("q", block_m * stride), ("k", 2 * block_n * stride),
                            ("stage", stage, "q"), ("p", block_m * (block_n + PAD))])


def static_bytes(block_m, cols):
    """Static shared memory of one CTA on a GPU: the row exchange and two one-word scratches."""
    return 4 * cols * block_m + 8


@lru_cache(maxsize=None)
def make_piece_end(HEAD_DIM, HEAD_DIM_V, FMT, BLOCK_M, BLOCK_N, COLS):
    """``finish_piece``: the row sums of all groups, then O_i / l_i through shared memory (the
    tiles are free after the barrier), one column group at a time, stored along rows:
    consecutive threads write consecutive columns, and each thread's few columns keep the
    address arithmetic it holds small (straight from the fragments, the 2 VH / 8 column offsets
    of every thread would be live through the whole kernel)."""
    THREADS = 32 * (BLOCK_M // 16) * COLS
    VH = value_cols(HEAD_DIM_V, COLS)
    DT = VH // 8
    STAGE_STRIDE = stage_stride(HEAD_DIM_V, COLS)
    STORE_COLS = -(-VH // THREADS)  # stored columns per thread and half
    shfl_xor = sync.shfl_xor
    _, _, _, _, put, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, THREADS // BLOCK_N, FMT, True)
    ZERO, ONE = float32(0.0), float32(1.0)

    @cuda.jit(device=True, inline="always")
    def finish_piece(out, lse, o_acc, lse_acc, stage, xchg, shfl_scratch, O_i, m_i, l_i, req,
                     split, slot, q_rows, rows, group, m0, hk, scale_log2, grp, x_row, s_row,
                     r_lo, t2, status, tid):
        memory.cp_async_wait(0)  # Q's copy, where the piece had no tile to wait for it
        for mask in (1, 2):
            for h2 in range(2):
                l_i[0, h2] += shfl_xor(l_i[0, h2], mask, shfl_scratch, tid)
        if t2 == 0:  # (every thread read the last maxima before the last P barrier)
            for h2 in range(2):
                xchg[x_row + 8 * h2] = l_i[0, h2]
        cuda.syncthreads()
        for h2 in range(2):
            r = uint32(r_lo + 8 * h2)
            l = xchg[r]
            for c in range(1, COLS):
                l += xchg[BLOCK_M * c + r]
            inv = ONE / l if l > ZERO else ZERO
            for dt in range(DT):
                for e in range(2):
                    O_i[0, dt, 2 * h2 + e] *= inv
            gr = m0 + r
            if grp == 0 and t2 == 0 and gr < q_rows:
                t = int32(convert.div_u32(gr, group))
                put_lse(lse, lse_acc, split, req, slot, t, hk * group + gr - t * group,
                        m_i[0, h2] * scale_log2, l, status)
        for gg in range(COLS):
            if grp == gg:
                for h2 in range(2):
                    for dt in range(DT):
                        for e in range(2):
                            stage[s_row + (8 * h2 * STAGE_STRIDE + 8 * dt + e)] = O_i[
                                0, dt, 2 * h2 + e]
            cuda.syncthreads()
            for k in range(STORE_COLS):
                c = tid + THREADS * k
                col = VH * gg + c
                if (VH % THREADS == 0 or c < VH) and col < HEAD_DIM_V:
                    for r in range(rows):  # a loop at run time: no per-row invariants
                        gr = m0 + r
                        t = int32(convert.div_u32(gr, group))
                        put(out, o_acc, split, req, slot, t, hk * group + gr - t * group,
                            col, stage[uint32(r * STAGE_STRIDE + c)], status)
            cuda.syncthreads()  # the stage is read before the next group (or piece) writes

    return finish_piece


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT, BLOCK_M, BLOCK_N, COLS, CACHE=None,
                           SPARSE=False):
    """Python kernel function for one configuration (``SPEC`` compiles it). ``SPARSE``: the
    block table holds each request's packed cache rows; ``CACHE = "v32"``: DeepSeek-V3.2's FP8
    rows, widened in the tile by the threads that copied them (sm_89)."""
    assert FMT in ("float16", "bfloat16") and supports(HEAD_DIM, HEAD_DIM_V)
    assert CACHE in (None, "v32")
    V32 = CACHE == "v32"
    assert BLOCK_M % 16 == 0 and SCHED_BLOCK % BLOCK_N == 0
    assert BLOCK_N % (8 * COLS) == 0 and BLOCK_N % 16 == 0
    SLABS = BLOCK_M // 16        # row slabs of 16 (one mma M each)
    THREADS = 32 * SLABS * COLS  # COLS warps per slab
    TPR = THREADS // BLOCK_N     # copy: threads per cache row
    Q_PASSES = -(-BLOCK_M // BLOCK_N)
    KEYS = BLOCK_N // COLS       # keys of S per warp
    VH = value_cols(HEAD_DIM_V, COLS)
    STRIDE = row_stride(HEAD_DIM, HEAD_DIM_V, COLS)
    P_STRIDE = BLOCK_N + PAD
    KSTEPS = HEAD_DIM // 16      # k-steps of Q K^T
    NT = KEYS // 8               # 8-column tiles of a warp's S
    DT = VH // 8                 # 8-column tiles of its O_i
    LAYOUT = shared_layout(BLOCK_M, BLOCK_N, COLS, HEAD_DIM, HEAD_DIM_V)
    Q_OFF, K_OFF, P_OFF = LAYOUT.q, LAYOUT.k, LAYOUT.p
    TILE = BLOCK_N * STRIDE      # elements of one cache tile
    XCHG = COLS * BLOCK_M        # floats: a row statistic of each column group
    STAGE_STRIDE = stage_stride(HEAD_DIM_V, COLS)
    SCRATCH = mma_sync.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma, pack = mma_sync.mma(FMT), convert.pack(FMT)
    ldsm_x4, ldsm_x4_t, ldsm_x2 = (mma_sync.ldmatrix_x4, mma_sync.ldmatrix_x4_trans,
                                   mma_sync.ldmatrix_x2)
    row_max = make_row_max(1, NT)
    update = make_online_update(1, NT, DT)
    cta_work, piece_of, row_source, copy_row, _, _ = make_paged_kv_walk(
        HEAD_DIM, BLOCK_M, TPR, FMT, True, SPARSE)
    copy_cache_row = make_row_copy(HEAD_DIM, TPR, FMT, True, CACHE) if V32 else copy_row
    if V32:
        widen_v32 = make_row_widen(HEAD_DIM, TPR, FMT, CACHE)
    finish_piece = make_piece_end(HEAD_DIM, HEAD_DIM_V, FMT, BLOCK_M, BLOCK_N, COLS)
    start_rows, mask_keys = make_row_keys(CAUSAL, NT, DT)
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def mma_into(a, b0, b1, C, t, scratch, tid):
        """C[0, t] += a (b0, b1): one m16n8k16 into an accumulator array."""
        c = mma(a, (b0, b1), (C[0, t, 0], C[0, t, 1], C[0, t, 2], C[0, t, 3]), scratch, tid)
        for e in range(4):
            C[0, t, e] = c[e]

    def mla_decode_mma(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                       o_acc, lse_acc, status, s_q, group, page_size, scale_log2):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        stage = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)      # (the epilogue's)
        xchg = cuda.shared.array(XCHG, float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        slab = warp % SLABS
        grp = warp // SLABS  # column group
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        rows = min(q_rows - m0, BLOCK_M)  # the tile's real query rows
        row = tid // TPR  # copy: this thread's row of every tile (and rows row + BLOCK_N i of Q),
        rl = tid % TPR    # its lane in the row (chunks rl, rl + TPR, ...)

        # Each lane's ldmatrix row address, up to a compile-time offset: Q and P as A operands
        # (its slab's rows), K as B operand (its group's keys), V through .trans (its columns).
        a_row, a_col = mma_sync.ldmatrix_a_rowcol(lane)
        b_row, b_col = mma_sync.ldmatrix_b_rowcol(lane)  # lanes 0-15: also the x2 address
        q_lane = Q_OFF + (16 * slab + a_row) * STRIDE + a_col
        p_lane = P_OFF + (16 * slab + a_row) * P_STRIDE + a_col
        k_lane = K_OFF + (KEYS * grp + b_row) * STRIDE + b_col
        v_lane = K_OFF + a_row * STRIDE + a_col + VH * grp
        # This thread's rows of the C fragments: r_lo and r_lo + 8 of the tile.
        r_lo = 16 * slab + g
        key0 = KEYS * grp + t2  # its first key column in a tile
        # Shared indices are unsigned: no negative-index fix-up for Numba to compute (and keep).
        p_word = uint32(P_OFF + r_lo * P_STRIDE + key0) >> 1  # its first P pair (all even)
        x_row = uint32(BLOCK_M * grp + r_lo)  # its rows' slots of the exchange
        s_row = uint32(r_lo * STAGE_STRIDE + t2)  # its first staged output element

        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        m_tile = cuda.local.array((1, 2), float32)
        limit = cuda.local.array(2, int32)
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits, part,
                                                       req, begin_req, end_req, status)
            n_tiles = (n_hi - n_lo + BLOCK_N - 1) // BLOCK_N if n_hi > n_lo else 0
            cuda.syncthreads()  # the previous piece is done with Q, the buffers and the exchange

            # Prologue: Q and the first cache tile in flight together; tile 1's table entry.
            for i in range(Q_PASSES):  # packed row m0 + r is token tq of head hq
                r = row + BLOCK_N * i
                if BLOCK_M % BLOCK_N == 0 or r < BLOCK_M:
                    gq = m0 + r
                    q_ok = gq < q_rows
                    tq = int32(convert.div_u32(gq, group)) if q_ok else int32(0)
                    hq = int32(hk * group + gq - tq * group) if q_ok else int32(0)
                    copy_row(smem, Q_OFF + r * STRIDE, q, hq, req, tq, q_ok, rl)
            page, pslot, ok = row_source(block_table, num_pages, req, n_lo + row, n_hi,
                                         page_size, status)
            if n_tiles > 0:
                copy_cache_row(smem, K_OFF + row * STRIDE, k_cache, hk, page, pslot, ok, rl)
            memory.cp_async_commit()
            page, pslot, ok = row_source(block_table, num_pages, req, n_lo + BLOCK_N + row, n_hi,
                                         page_size, status)

            # Keys each of the thread's rows may see: the piece's, and (causal) those before its
            # token's diagonal.
            start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, m0 + r_lo)

            for j in range(n_tiles):
                n0 = n_lo + j * BLOCK_N
                buf = (j & 1) * TILE
                memory.cp_async_wait(0)  # tile j, the only copy in flight, has landed ...
                if V32:  # (this thread's own chunks: before the barrier shows them to others)
                    widen_v32(smem_words, K_OFF + buf + row * STRIDE, rl)
                cuda.syncthreads()       # ... for every thread; every warp is done with tile
                if j + 1 < n_tiles:      # j - 1, so its buffer takes tile j + 1 meanwhile
                    copy_cache_row(smem, K_OFF + TILE - buf + row * STRIDE, k_cache, hk, page,
                                   pslot, ok, rl)
                    memory.cp_async_commit()
                    page, pslot, ok = row_source(block_table, num_pages, req,
                                                 n0 + 2 * BLOCK_N + row, n_hi, page_size, status)

                # 1. This warp's KEYS keys of S = Q K^T over all HEAD_DIM columns: one Q fragment
                # per k-step feeds its NT 8-key tiles (two per ldmatrix.x4 of K).
                for nt in range(NT):
                    for e in range(4):
                        S[0, nt, e] = ZERO
                for ks in range(KSTEPS):
                    qa = ldsm_x4(smem, q_lane + 16 * ks, scratch, tid)
                    for np2 in range(NT // 2):
                        k0, k1, k2, k3 = ldsm_x4(smem, k_lane + buf + 16 * np2 * STRIDE + 16 * ks,
                                                 scratch, tid)
                        mma_into(qa, k0, k1, S, 2 * np2, scratch, tid)
                        mma_into(qa, k2, k3, S, 2 * np2 + 1, scratch, tid)
                    if NT % 2:  # BLOCK_N 16: one 8-key tile
                        k0, k1 = ldsm_x2(smem, k_lane + buf + 16 * ks, scratch, tid)
                        mma_into(qa, k0, k1, S, NT - 1, scratch, tid)
                mask_keys(S, limit, n0 + key0)  # keys past the row's limit: -inf
                row_max(S, m_tile, shfl_scratch, tid)

                # 2. The maxima of the COLS groups -> the same m_tile in every warp of the slab.
                if t2 == 0:
                    for h2 in range(2):
                        xchg[x_row + 8 * h2] = m_tile[0, h2]
                cuda.syncthreads()
                for h2 in range(2):
                    r = uint32(r_lo + 8 * h2)
                    mx = xchg[r]
                    for c in range(1, COLS):
                        mx = max(mx, xchg[BLOCK_M * c + r])
                    m_tile[0, h2] = mx
                update(S, m_i, l_i, O_i, m_tile, scale_log2)

                # 3. This warp's block of P, rounded to 16 bits, into the P tile.
                for nt in range(NT):
                    for h2 in range(2):
                        smem_words[p_word + (8 * h2 * P_STRIDE + 8 * nt) // 2] = pack(
                            S[0, nt, 2 * h2], S[0, nt, 2 * h2 + 1])
                cuda.syncthreads()

                # 4. O_i[:, own columns] += P V[:, own columns], 16 keys per k-step: each P
                # fragment feeds the DT 8-column tiles (two per ldmatrix.x4.trans of V).
                for kk in range(BLOCK_N // 16):
                    pa = ldsm_x4(smem, p_lane + 16 * kk, scratch, tid)
                    for dp in range(DT // 2):
                        v0, v1, v2, v3 = ldsm_x4_t(smem, v_lane + buf + 16 * kk * STRIDE + 16 * dp,
                                                   scratch, tid)
                        mma_into(pa, v0, v1, O_i, 2 * dp, scratch, tid)
                        mma_into(pa, v2, v3, O_i, 2 * dp + 1, scratch, tid)

            finish_piece(out, lse, o_acc, lse_acc, stage, xchg, shfl_scratch, O_i, m_i, l_i, req,
                         split, slot, q_rows, rows, group, m0, hk, scale_log2, grp, x_row, s_row,
                         r_lo, t2, status, tid)

    return mla_decode_mma


# ----------------------------------------------------------------------------- spec

class Spec(DecodeSpec):
    name = "mla_decode_mma"
    unroll_loops = True

    def entry(self, config, device):
        limit = device.shared_per_block if device is not None else None
        fits = [t for t in TILES if limit is None or self.tiles(config, t).shared_bytes
                + static_bytes(t[0], t[2]) <= limit]
        return (fits or TILES[-1:])[0]

    def tiles(self, config, entry):
        bm, bn, cols, regs = entry
        return Tiles(bm, bn, 32 * (bm // 16) * cols,
                     shared_layout(bm, bn, cols, config.head_dim, config.head_dim_v).bytes, regs)

    def make(self, config, tiles):
        cols = tiles.threads // (32 * (tiles.BLOCK_M // 16))
        return make_mla_decode_kernel(config.head_dim, config.head_dim_v, config.causal,
                                      config.fmt, tiles.BLOCK_M, tiles.BLOCK_N, cols,
                                      config.cache, config.sparse)

    def signature(self, config):
        args = list(super().signature(config).args)
        if config.cache:  # V3.2's rows: bytes
            args[1] = tensor_type("float8_e4m3fn")
        return types.void(*args)

    def samples(self):
        """The decode's samples at both tile entries; the sparse decode of V3.2's FP8 rows (for
        sm_89, whose e4m3 conversions it needs)."""
        return [Sample(f"tc mma mla {label} tiles={entry}", (*config, True), entry, ccs=(SM80,))
                for entry in TILES for label, config in TC_DECODE_SAMPLES] + [
            Sample(f"tc mma mla sparse q_rows={rows} {cache or 'bfloat16'} cache tiles={entry}",
                   DecodeConfig(rows, 576, 512, False, "bfloat16", True, cache=cache,
                                sparse=True), entry, ccs=ccs)
            for rows, cache, entry, ccs in ((128, "v32", TILES[1], ((8, 9),)),)]


SPEC = Spec()
