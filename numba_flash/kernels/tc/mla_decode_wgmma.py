"""Paged MLA decode on Hopper's warpgroup tensor cores (``wgmma``): FlashMLA's kernel shape.

What it computes
    The function of ``simt/mla_decode.py`` (read its docstring first: the packed query rows, the
    scheduler's pieces, split-KV partials and the combine are the same, and so is the paged-KV
    walk of ``common/paged_kv.py``), with both products on tensor cores. The ``s_q * h_q / h_kv``
    query rows of a KV head are packed as M in tiles of BLOCK_M = 64 rows (one wgmma M; a ragged
    last tile is padded with zero rows, never stored), Q stays in shared memory for a whole
    piece, and each 64-row cache tile gathered through the block table serves as K for
    ``S = Q K^T`` over all HEAD_DIM columns and, through its first HEAD_DIM_V columns, as V for
    ``O += P V``: the cache is read once per 64 query rows.

Grid / block mapping
    grid = (scheduler parts, h_kv, ceil(q_rows / 64)); block = 2 warpgroups (256 threads).
    O_i (64 x HEAD_DIM_V) is too large for one warpgroup's registers (512 columns: 256 floats
    per thread), so the warpgroups split it by columns: warpgroup ``wg`` owns O_i columns
    ``VH wg .. VH wg + VH - 1`` (VH = 256 for HEAD_DIM_V = 512: 128 accumulator floats per
    thread). Computing S twice, once per warpgroup, would cost as much tensor work as P V again,
    so the warpgroups split S by keys instead: warpgroup ``wg`` computes the 64 x 32 block of
    keys ``32 wg .. 32 wg + 31`` of every tile (a wgmma m64n32k16 chain over HEAD_DIM). One row
    of the online softmax then lives in two warpgroups:

        1. each computes its block of S and the row maxima over its 32 keys (quad shuffles);
        2. the maxima cross through shared memory (a barrier): both take the max of the two,
           so both move m_i, rescale their half of O_i and compute P with the same numbers;
        3. each writes its block of P (16 bits) to a shared 64 x 64 P tile (a barrier);
        4. each multiplies the whole P tile by its V columns: O_i[:, own] += P V[:, own]
           (a wgmma chain m64nVHk16 with both operands in shared memory).

    l_i is summed per warpgroup over its own keys (the two share every m_i, so the partial sums
    have one scale) and added up once per piece. Per thread, in registers: 16 floats of S/P, VH /
    2 of O_i, and m_i, l_i of its two rows (the C-fragment layout of ``forward_mma.py``: lane ``g
    = lane / 4`` of warp ``w`` holds rows ``16 (w % 4) + g`` and ``+ 8``).

Memory pipeline
    Double buffered: tile j + 1 is in flight while tile j is multiplied. Two ways to fill a
    buffer, chosen per call (``TMA``):

    * TMA (page sizes that are multiples of 64, so a tile is 64 consecutive rows of one page):
      thread 0 reads the tile's block-table entry and issues one TMA box copy per 64 columns
      (``instructions.tma``; the map is the cache's, ``runtime/tma.py``), completing on the
      buffer's mbarrier, which every thread waits on. A page number that is not a page of the
      cache is reported and replaced by -1, whose boxes the TMA unit fills with zeros. Rows
      past the piece end hold whatever the page holds there (NaN in the tests): S masks them,
      and their V columns are zeroed in shared memory before P V, since 0 * NaN is NaN.
    * cp.async (every other page size): every thread copies 16-byte chunks ``rl, rl + 4, ...``
      (rl = tid % 4) of cache row ``tid / 4`` (zero-filled for rows past the piece end or that
      the block table cannot place), the block-table entries read one tile ahead.

    * Sparse (DeepSeek-V3.2's ``indices``, ``SPARSE``): the cp.async path with each row looked
      up in the request's packed cache rows (``paged_kv.make_paged_kv_walk``). V3.2's FP8 rows
      (``CACHE = "v32"``) use ``paged_kv.make_row_copy`` with this tile's chunk placement
      (``swizzled_chunk``): e4m3 chunks land in the second of their two tile chunks, the row's
      scales beside each lane's first one, and after its cp.async wait each thread widens its
      own chunks to ``bf16(x * bf16(scale))``, before the tile's barrier.

    Q is copied with cp.async with the first tile of each piece. wgmma reads shared memory
    through the async proxy, so each ordinary or cp.async write (those tiles, Q, the P tile, the
    zeroed rows) is published by wait -> ``proxy_fence`` -> barrier.

Shared memory (16-bit elements, every tile in ``ptx/wgmma.py``'s 128-byte swizzle)
    The layout of ``decode_tiles.py``, shared with the seesaw: Q (64 x QW, QW = HEAD_DIM rounded
    up to 64 columns), the two cache tiles (64 x KW each, KW = max(QW, 2 VH); V is the first 2
    VH columns of each), the P tile (64 x 64) and 1 KiB to put the tiles on a 1024-byte
    boundary; 512 bytes (static) for the exchange of row maxima and sums, 16 bytes for the two
    mbarriers. HEAD_DIM 576, HEAD_DIM_V 512: 225 KiB, one CTA per SM (an H100 / H200 gives a
    block up to 227 KiB).

Limits
    float16 / bfloat16 (V3.2's rows: bfloat16, 576 / 512); HEAD_DIM a multiple of 16 up to
    576, HEAD_DIM_V up to 512 (VH <= 256,
    wgmma's largest N), q and the cache 16-byte aligned rows (the API sends other views to the
    simt kernel); any page size; compute capability 9.0 (sm_90a). Unlike FlashMLA, no table
    entry, length or metadata value can move a copy or a store outside its array
    (``common/paged_kv.py``).
"""

from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32, uint64

from ...runtime import tma as tma_maps
from ...runtime.spec import SM90A, Sample, Tiles
from ..attention import TC_DECODE_SAMPLES, DecodeConfig, DecodeSpec, tensor_type
from ..common.paged_kv import (make_page_lookup, make_paged_kv_walk, make_piece_out,
                               make_row_copy, make_row_keys, make_row_widen)
from ..common.softmax import make_online_update, make_row_max
from ..instructions import convert, memory, sync, tma, wgmma
from .decode_tiles import (BLOCK_M, BLOCK_N, MAX_HEAD_DIM, MAX_HEAD_DIM_V, THREADS, TPR,
                           shared_layout, tile_cols, value_cols)

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
KEYS = BLOCK_N // 2         # keys of S per warpgroup
XCHG = 2 * BLOCK_M          # floats: a row statistic of each warpgroup


def supports(head_dim, head_dim_v):
    """Whether this kernel takes the head dims (other ones run the simt decode)."""
    return head_dim % 16 == 0 and head_dim <= MAX_HEAD_DIM and head_dim_v <= MAX_HEAD_DIM_V


@lru_cache(maxsize=None)
def make_tile_copies(HEAD_DIM, HEAD_DIM_V):
    """The copies into the swizzled tiles ("Memory pipeline"):

        chunk_at(i, rows, even, odd)       a thread's chunk i of a row, in a tile of ``rows``
        copy_cache_row(smem, at, k_cache, hk, page, slot, ok, even, odd, rl)   (cp.async)
        load_tile(smem, at, tmap, k_cache, bars, b, block_table, num_pages, req, n0, hk,
                  page_size, status)       (thread 0, TMA) a whole tile
        zero_rows_past(smem_words, at, valid, tid)   V rows past the piece end
    """
    QW, _ = tile_cols(HEAD_DIM, HEAD_DIM_V)
    CHUNKS = HEAD_DIM // 8       # 16-byte chunks of a row
    CPT = -(-CHUNKS // TPR)      # ... per copying thread
    CHUNKS_EXACT = CHUNKS % TPR == 0
    BOXES = QW // wgmma.BLOCK_COLS   # TMA boxes (64 columns) of a tile: HEAD_DIM's
    BOX = BLOCK_N * wgmma.BLOCK_COLS
    TILE_BYTES = 2 * BOXES * BOX
    V_WORDS = value_cols(HEAD_DIM_V)  # 32-bit words of a row's 2 VH V columns
    copy16 = memory.cp_async_16_zfill
    _, _, lookup = make_page_lookup(int32(-1))  # page -1: TMA boxes of zeros

    @cuda.jit(device=True, inline="always")
    def chunk_at(i, rows, even, odd):
        """Offset of this thread's chunk ``rl + 4 i`` in a swizzled tile of ``rows`` rows, from
        its two in-block offsets: chunks ``rl + 8 k`` and ``rl + 4 + 8 k`` of a row land on
        ``(rl ^ row % 8)`` and that ``^ 4`` (see ``wgmma.tile_offset``), so two registers and
        a constant per chunk replace the swizzle arithmetic of each of the row's chunks."""
        return (i >> 1) * rows * wgmma.BLOCK_COLS + (odd if i & 1 else even)

    @cuda.jit(device=True, inline="always")
    def copy_cache_row(smem, at, k_cache, hk, page, slot, ok, even, odd, rl):
        """This thread's chunks of one cache row into its row of the tile at ``at``."""
        for i in range(CPT):
            if CHUNKS_EXACT or rl + TPR * i < CHUNKS:
                copy16(smem, at + chunk_at(i, BLOCK_N, even, odd), k_cache,
                       (page, slot, hk, uint64(8 * (rl + TPR * i))), ok)

    @cuda.jit(device=True, inline="always")
    def load_tile(smem, at, tmap, k_cache, bars, b, block_table, num_pages, req, n0, hk,
                  page_size, status):
        """(Thread 0, TMA) The tile of keys n0 .. n0 + 63 into the buffer at ``at``, completing
        on barrier ``b``: one page, rows n0 % page_size on, one box per 64 columns."""
        blk = int32(convert.div_u32(n0, page_size))
        page, _ = lookup(block_table, num_pages, req, blk, status)
        tma.expect_tx(bars, b, TILE_BYTES)
        for c in range(BOXES):
            tma.load_box_4d(smem, at + c * BOX, tmap, k_cache,
                            (int32(c * wgmma.BLOCK_COLS), hk, n0 - blk * page_size, page),
                            BLOCK_N, bars, b)

    @cuda.jit(device=True, inline="always")
    def zero_rows_past(smem_words, at, valid, tid):
        """Zero the V columns of rows ``valid`` .. 63 of the tile at ``at`` (their P is 0, but a
        NaN there would still reach O through 0 * NaN)."""
        for w in range(tid, (BLOCK_N - valid) * V_WORDS, THREADS):
            r = valid + w // V_WORDS
            col = 2 * (w - (r - valid) * V_WORDS)
            smem_words[uint32(at + wgmma.tile_offset(r, col, BLOCK_N)) >> 1] = uint32(0)

    return chunk_at, copy_cache_row, load_tile, zero_rows_past


@cuda.jit(device=True, inline="always")
def swizzled_chunk(at, c, origin):
    """Element of 16-byte chunk ``c`` of the cache-tile row that starts (in its first column
    block) at 16-bit element ``at`` of a shared array whose first byte is at shared address
    ``origin`` (``paged_kv.make_row_copy``'s PLACE for these tiles). The swizzle follows the
    absolute address: the tile starts on a 1024-byte boundary, so the row's key ``row % 8`` is
    bits 7-9 of its address (not of ``at``: the dynamic array itself is only 16-byte aligned)."""
    key = ((origin + 2 * at) >> 7) & 7
    return at + (c >> 3) * (BLOCK_N * wgmma.BLOCK_COLS) + (((c & 7) ^ key) << 3)


@lru_cache(maxsize=None)
def make_piece_end(HEAD_DIM, HEAD_DIM_V, FMT):
    """``finish_piece``: the row sums of both warpgroups, then O_i / l_i staged over the tiles
    (nothing is in flight there now) and copied out by rows; the lse (final or partial)."""
    VH = value_cols(HEAD_DIM_V)
    shfl_xor = sync.shfl_xor
    _, _, _, _, _, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, True)
    stage, write = make_piece_out(HEAD_DIM_V, VH, BLOCK_M, THREADS // 32, FMT)
    ZERO, ONE = float32(0.0), float32(1.0)

    @cuda.jit(device=True, inline="always")
    def finish_piece(out, lse, o_acc, lse_acc, smem, smem_words, smem_f32, xchg, shfl_scratch,
                     O_i, m_i, l_i, req, split, slot, base, q_rows, group, m0, hk, scale_log2, wg,
                     warp, lane, r_lo, t2, status, tid):
        memory.cp_async_wait(0)  # Q's copy, where the piece had no tile to wait for it
        for mask in (1, 2):
            for half in range(2):
                l_i[0, half] += shfl_xor(l_i[0, half], mask, shfl_scratch, tid)
        if t2 == 0:  # (every thread read the last maxima before the last P barrier)
            for half in range(2):
                xchg[BLOCK_M * wg + r_lo + 8 * half] = l_i[0, half]
        cuda.syncthreads()  # ... and every warpgroup's wgmma reads of the tiles are done
        for half in range(2):
            r = r_lo + 8 * half
            l = xchg[r] + xchg[BLOCK_M + r]
            inv = ONE / l if l > ZERO else ZERO
            stage(smem_words, smem_f32, base >> 1, O_i, VH * wg, r, half, t2, inv, split)
            gr = m0 + r
            if wg == 0 and t2 == 0 and gr < q_rows:
                t = int32(convert.div_u32(gr, group))
                put_lse(lse, lse_acc, split, req, slot, t, hk * group + gr - t * group,
                        m_i[0, half] * scale_log2, l, status)
        cuda.syncthreads()
        write(out, o_acc, smem, smem_f32, base >> 1, split, req, slot, m0, q_rows, group, hk,
              warp, lane, status)
        sync.proxy_fence()  # these reads before the next piece's copies into the tiles

    return finish_piece


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT, TMA, CACHE=None, SPARSE=False):
    """Python kernel function for one configuration (``SPEC`` compiles it, for sm_90a).
    ``SPARSE``: the block table holds each request's packed cache rows; ``CACHE = "v32"``:
    DeepSeek-V3.2's FP8 rows (cp.async only)."""
    assert FMT in ("float16", "bfloat16") and supports(HEAD_DIM, HEAD_DIM_V)
    V32 = CACHE == "v32"
    assert CACHE in (None, "v32") and not (V32 and TMA) and not (SPARSE and TMA)
    QW, KW = tile_cols(HEAD_DIM, HEAD_DIM_V)
    VH = value_cols(HEAD_DIM_V)
    KSTEPS = HEAD_DIM // 16      # k-steps of Q K^T
    NT = KEYS // 8               # 8-column tiles of a warpgroup's S
    DT = VH // 8                 # 8-column tiles of its O_i
    S_REGS, O_REGS = 4 * NT, 4 * DT
    LAYOUT = shared_layout(HEAD_DIM, HEAD_DIM_V)
    Q_OFF, K_OFF, P_OFF = LAYOUT.q, LAYOUT.k, LAYOUT.p
    TILE = BLOCK_N * KW          # elements of one cache tile
    CHUNKS = HEAD_DIM // 8       # 16-byte chunks of a row
    CPT = -(-CHUNKS // TPR)      # ... per copying thread
    CHUNKS_EXACT = CHUNKS % TPR == 0
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(FMT, KEYS, 0)    # S = Q K^T, K read K-major
    mma_o = wgmma.mma_ss(FMT, VH, 1)      # O += P V, V read MN-major
    pack = convert.pack(FMT)
    copy16 = memory.cp_async_16_zfill
    row_max = make_row_max(1, NT)
    update = make_online_update(1, NT, DT)
    cta_work, piece_of, row_source, _, _, _ = make_paged_kv_walk(
        HEAD_DIM, BLOCK_M, TPR, FMT, True, SPARSE)
    start_rows, mask_keys = make_row_keys(CAUSAL, NT, DT)
    chunk_at, copy_cache_row, load_tile, zero_rows_past = make_tile_copies(HEAD_DIM, HEAD_DIM_V)
    finish_piece = make_piece_end(HEAD_DIM, HEAD_DIM_V, FMT)
    if V32:  # the latent chunks land as e4m3 and are widened by the thread that copied them
        copy_v32 = make_row_copy(HEAD_DIM, TPR, FMT, True, CACHE, PLACE=swizzled_chunk)
        widen_v32 = make_row_widen(HEAD_DIM, TPR, FMT, CACHE, PLACE=swizzled_chunk)

    @cuda.jit(device=True, inline="always")
    def copy_row(smem, tile, k_cache, hk, page, pslot, ok, even, odd, rl, row):
        """This thread's chunks of its row of the cache tile at ``tile`` (cp.async)."""
        if V32:
            copy_v32(smem, tile + row * wgmma.BLOCK_COLS, k_cache, hk, page, pslot, ok, rl)
        else:
            copy_cache_row(smem, tile, k_cache, hk, page, pslot, ok, even, odd, rl)

    # Descriptor arithmetic in 16-byte units (ptx/wgmma.py, "Shared-memory operands";
    # wgmma.k_step for K-major k-steps): V's 64-column blocks are BLOCK_N rows of 128 bytes
    # apart, the second cache buffer is TILE elements on.
    SBO, V_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    V_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES
    BUF_STEP = TILE * 2 // 16
    KEYS_STEP = KEYS * wgmma.SWIZZLE_BYTES // 16     # warpgroup 1's keys: rows 32 .. 63
    V_COLS_STEP = VH * BLOCK_N * 2 // 16             # warpgroup 1's V: VH columns on

    def mla_decode_wgmma(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                         o_acc, lse_acc, status, s_q, group, page_size, scale_log2, tmap):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        smem_f32 = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)  # ... again
        xchg = cuda.shared.array(XCHG, float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        bars = cuda.shared.array(2, uint64)  # TMA: one mbarrier per cache buffer
        tid = cuda.threadIdx.x
        # The combine may launch now (it waits for this grid before it reads the partials): its
        # launch and its CTAs for the requests no part splits run alongside this grid.
        sync.launch_dependents()
        wg = tid >> 7
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        phases = 0  # TMA: bit b, the parity of barrier b's next phase
        if TMA:
            if tid == 0:
                tma.tensormap_acquire(tmap)
                for b in range(2):
                    tma.mbarrier_init(bars, b, 1)
                tma.mbarrier_init_fence()
            cuda.syncthreads()
        row = tid // TPR  # copy: this thread's row of every tile (and of Q),
        rl = tid % TPR    # its lane in the row (TPR = 4: chunks rl, rl + 4, ...)
        even = row * wgmma.BLOCK_COLS + ((rl ^ (row & 7)) << 3)
        odd = row * wgmma.BLOCK_COLS + (((rl + 4) ^ (row & 7)) << 3)
        base = wgmma.aligned_base(smem)  # the tiles start on a 1024-byte boundary

        # This thread's rows of the C fragments: r_lo and r_lo + 8 of the 64, and their tokens.
        r_lo = 16 * (warp & 3) + g
        key0 = KEYS * wg + t2  # its first key column in a tile
        # The query row this thread copies: packed row m0 + row is token t of head h.
        gq = m0 + row
        q_ok = gq < q_rows
        tq = int32(convert.div_u32(gq, group)) if q_ok else int32(0)
        hq = int32(hk * group + gq - tq * group) if q_ok else int32(0)

        desc_q = wgmma.descriptor(smem, base + Q_OFF, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO) + uint64(wg * KEYS_STEP)
        desc_p = wgmma.descriptor(smem, base + P_OFF, 16, SBO)
        desc_v = wgmma.descriptor(smem, base + K_OFF, V_LBO, SBO) + uint64(wg * V_COLS_STEP)

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
            cuda.syncthreads()  # the previous piece is done with Q, P and the exchange

            # Prologue: Q and the first cache tile in flight together; tile 1's table entry.
            for i in range(CPT):
                if CHUNKS_EXACT or rl + TPR * i < CHUNKS:
                    copy16(smem, base + Q_OFF + chunk_at(i, BLOCK_M, even, odd), q,
                           (req, tq, hq, uint64(8 * (rl + TPR * i))), q_ok)
            if TMA:
                if tid == 0 and n_tiles > 0:
                    load_tile(smem, base + K_OFF, tmap, k_cache, bars, 0, block_table,
                              num_pages, req, n_lo, hk, page_size, status)
                memory.cp_async_commit()
            else:
                page, pslot, ok = row_source(block_table, num_pages, req, n_lo + row, n_hi,
                                             page_size, status)
                if n_tiles > 0:
                    copy_row(smem, base + K_OFF, k_cache, hk, page, pslot, ok, even, odd, rl,
                             row)
                memory.cp_async_commit()
                page, pslot, ok = row_source(block_table, num_pages, req, n_lo + BLOCK_N + row,
                                             n_hi, page_size, status)

            # Keys each of the thread's rows may see: the piece's, and (causal) those before its
            # token's diagonal.
            start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, m0 + r_lo)

            for j in range(n_tiles):
                n0 = n_lo + j * BLOCK_N
                memory.cp_async_wait(0)  # tile j (cp.async) or Q has landed ...
                if V32:  # (this thread's own chunks: before the barrier shows them to others)
                    widen_v32(smem_words, base + K_OFF + (j & 1) * TILE + row * wgmma.BLOCK_COLS,
                              rl)
                sync.proxy_fence()       # ... is visible to wgmma reads ...
                cuda.syncthreads()       # ... for every thread; tile j - 1 is done with
                buf = uint64((j & 1) * BUF_STEP)
                if TMA:  # tile j + 1 into the buffer tile j - 1 left; wait for tile j
                    if tid == 0 and j + 1 < n_tiles:
                        load_tile(smem, base + K_OFF + TILE - (j & 1) * TILE, tmap, k_cache,
                                  bars, 1 - (j & 1), block_table, num_pages, req, n0 + BLOCK_N,
                                  hk, page_size, status)
                    tma.wait(bars, j & 1, (phases >> (j & 1)) & 1)
                    phases ^= 1 << (j & 1)
                    if n_hi - n0 < BLOCK_N:
                        zero_rows_past(smem_words, base + K_OFF + (j & 1) * TILE, n_hi - n0, tid)
                        sync.proxy_fence()
                        cuda.syncthreads()

                # 1. This warpgroup's 32 keys of S = Q K^T, over all HEAD_DIM columns; while the
                # tensor cores work, the copies of tile j + 1 are issued into the other buffer.
                wgmma.fence()
                for ks in range(KSTEPS):
                    mma_s(S, 0, desc_q + k_step(ks, BLOCK_M), desc_k + buf + k_step(ks, BLOCK_N),
                          ks > 0, smem, scratch, tid)
                wgmma.commit()
                if not TMA and j + 1 < n_tiles:
                    copy_row(smem, base + K_OFF + TILE - (j & 1) * TILE, k_cache, hk, page,
                             pslot, ok, even, odd, rl, row)
                    memory.cp_async_commit()
                    page, pslot, ok = row_source(block_table, num_pages, req,
                                                 n0 + 2 * BLOCK_N + row, n_hi, page_size, status)
                wgmma.wait(0)
                wgmma.fence_operands(S, S_REGS)
                mask_keys(S, limit, n0 + key0)  # keys past the row's limit: -inf
                row_max(S, m_tile, shfl_scratch, tid)

                # 2. Both warpgroups' maxima -> the same m_tile in both.
                if t2 == 0:
                    for half in range(2):
                        xchg[BLOCK_M * wg + r_lo + 8 * half] = m_tile[0, half]
                cuda.syncthreads()
                for half in range(2):
                    r = r_lo + 8 * half
                    m_tile[0, half] = max(xchg[r], xchg[BLOCK_M + r])
                update(S, m_i, l_i, O_i, m_tile, scale_log2)

                # 3. This warpgroup's block of P, rounded to 16 bits, into the P tile.
                for nt in range(NT):
                    for half in range(2):
                        word = uint32(base + P_OFF + wgmma.tile_offset(
                            r_lo + 8 * half, KEYS * wg + 8 * nt + t2, BLOCK_M)) >> 1
                        smem_words[word] = pack(S[0, nt, 2 * half], S[0, nt, 2 * half + 1])
                sync.proxy_fence()
                cuda.syncthreads()

                # 4. O_i[:, own columns] += P V[:, own columns], 16 keys per wgmma.
                wgmma.fence()
                for kk in range(BLOCK_N // 16):
                    mma_o(O_i, 0, desc_p + k_step(kk, BLOCK_M), desc_v + buf + uint64(kk * V_STEP), 1,
                          smem, scratch, tid)
                wgmma.commit()
                wgmma.wait(0)
                wgmma.fence_operands(O_i, O_REGS)

            finish_piece(out, lse, o_acc, lse_acc, smem, smem_words, smem_f32, xchg, shfl_scratch,
                         O_i, m_i, l_i, req, split, slot, base, q_rows, group, m0, hk,
                         scale_log2, wg, warp, lane, r_lo, t2, status, tid)

    return mla_decode_wgmma


# ----------------------------------------------------------------------------- spec

class Spec(DecodeSpec):
    name = "mla_decode_wgmma"
    allows_dependents = True
    unroll_loops = True

    def entry(self, config, device):
        return ()  # one tile shape: BLOCK_M = BLOCK_N = 64, two warpgroups

    def tiles(self, config, entry):
        return Tiles(BLOCK_M, BLOCK_N, THREADS,
                     shared_layout(config.head_dim, config.head_dim_v).bytes)

    def signature(self, config):
        args = list(super().signature(config).args)
        if config.cache:  # V3.2's rows: bytes
            args[1] = tensor_type("float8_e4m3fn")
        return types.void(*args, types.Array(types.uint64, 1, "A"))

    def arguments(self, config, p):
        k_cache = p["k_cache"]
        tmap = tma_maps.box_map(k_cache, BLOCK_N) if config.tma else tma_maps.no_map(k_cache)
        return super().arguments(config, p) + (tmap,)

    def make(self, config, tiles):
        return make_mla_decode_kernel(config.head_dim, config.head_dim_v, config.causal,
                                      config.fmt, config.tma, config.cache, config.sparse)

    def samples(self):
        """Both ways of filling the cache tiles: cp.async, and TMA boxes on mbarriers; the
        sparse decode of V3.2's FP8 rows (128 rows; a bfloat16 cache's sparse decode is the
        cp.async code with another table walk)."""
        return [Sample(f"tc wgmma mla {label}{' tma' if tma else ''}", (*config, True, tma),
                       ccs=(SM90A,))
                for tma in (False, True) for label, config in TC_DECODE_SAMPLES] + [
            Sample(f"tc wgmma mla sparse q_rows={rows} {cache or 'bfloat16'} cache",
                   DecodeConfig(rows, 576, 512, False, "bfloat16", True, cache=cache,
                                sparse=True), ccs=(SM90A,))
            for rows, cache in ((128, "v32"),)]


SPEC = Spec()
