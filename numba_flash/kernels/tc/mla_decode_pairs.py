"""Paged MLA decode on Hopper for pages of whole tiles: each warpgroup scores its own tile of a
pair, and both multiply both tiles' P by their half of V.

What it computes
    The function of ``simt/mla_decode.py`` and ``tc/mla_decode_wgmma.py`` (read the latter
    first: the packed query rows, Q in shared memory, the cache tile that is K and, through its
    first HEAD_DIM_V columns, V, the split of O_i's columns between two warpgroups, the TMA boxes
    and the bounded paged-KV walk are the same). What changes is who computes S. There each
    warpgroup computed 32 keys of every 64-key tile, a wgmma N of 32 that reads Q's A operand
    from shared memory twice per tile, and the warpgroups met three times per tile. Here the
    tiles of a piece go in pairs (A, B) = (2p, 2p + 1), tile A in cache buffer 0 and B in
    buffer 1, and warpgroup ``wg`` computes the whole 64 x 64 S of tile ``2p + wg`` (a wgmma
    m64n64k16 chain over HEAD_DIM, Q read once per tile):

        1. S_own = Q K_own^T, each 64-column box of K_own waited for on its own mbarrier, so
           the chain starts on the first box while later ones are still landing;
        2. the row maxima of both tiles cross once through shared memory (a barrier), both
           warpgroups move m_i to the same value, rescale their half of O_i and l_i, and turn
           S_own into P_own (``common/softmax.py``'s lazy online update);
        3. O_i[:, own] += P_own V_own[:, own]: P_own is the A operand straight from the
           registers (``wgmma`` rs), and is also stored, 16-bit, into the P block of its buffer
           (the 64 columns after V, free once S_own is done: for DeepSeek's 576 = 512 + 64 it is
           the rope block) for the other warpgroup (a barrier);
        4. O_i[:, own] += P_other V_other[:, own] (wgmma ss).

    Per pair the warpgroups meet twice; the tensor work per tile is one m64n64 S chain and two
    m64n(HEAD_DIM_V/2) P V chains, as in FlashMLA.

Grid / block mapping
    grid = (scheduler parts, h_kv, ceil(q_rows / 64)); block = 2 warpgroups (256 threads). Per
    thread, in registers: 32 floats of S/P, VH / 2 of O_i (VH = 256 at HEAD_DIM_V = 512), 16
    words of packed P, m_i and l_i of its two rows.

Memory pipeline
    Both cache buffers hold a tile during a pair, so the next pair's tiles are loaded box by box
    as the boxes are released: a warpgroup releases the boxes of its own tile that only it
    reads (its V half and the K-only boxes) as soon as its rs product is done, and the boxes the
    other warpgroup reads (that one's V half and the P block) are released by the other after
    its ss product. One thread of the releasing warpgroup reads the next tile's block-table
    entry and issues its boxes (``instructions.tma``), each completing on its own mbarrier.
    The owner of the next tile starts its S chain on the boxes released first. A page number
    that is not a page of the cache is reported and replaced by -1, whose boxes the TMA unit
    fills with zeros. Rows past the piece end hold whatever the page holds (NaN in the tests):
    S masks them, and their V columns are zeroed in shared memory before any P V (0 * NaN is
    NaN), once per piece. Q is copied with cp.async at the start of each piece.

Shared memory (16-bit elements, ``ptx/wgmma.py``'s 128-byte swizzle)
    Q   64 x QW          QW = HEAD_DIM rounded up to 64 columns
    K   2 x 64 x KW      KW = max(QW, 2 VH + 64): V is the first 2 VH columns, P the next 64
    + 1 KiB of alignment, and (static) 512 bytes for the row maxima and sums, 8 bytes per box
    mbarrier. HEAD_DIM 576, HEAD_DIM_V 512: 72 + 144 + 1 KiB = 217 KiB, one CTA per SM.

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 16 up to 576, HEAD_DIM_V up to 512; page sizes
    that are multiples of 64 (other page sizes run ``tc/mla_decode_wgmma.py``); q and the cache
    16-byte aligned rows; compute capability 9.0 (sm_90a). No table entry, length or metadata
    value can move a copy or a store outside its array (``common/paged_kv.py``).
"""

from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32, uint64

from ...runtime import tma as tma_maps
from ...runtime.spec import Tiles
from ..attention import DecodeSpec
from ..common import constants
from ..common.paged_kv import SCHED_BLOCK, make_paged_kv_walk, make_row_keys
from ..common.softmax import make_online_update, make_row_max
from ..common.status import BAD_TABLE_ENTRY, PAST_TABLE, report
from ..instructions import convert, memory, sync, tma, wgmma
from .mla_decode_wgmma import MAX_HEAD_DIM, MAX_HEAD_DIM_V, supports, value_cols  # noqa: F401

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
WARPGROUP = wgmma.WARPGROUP
THREADS = 2 * WARPGROUP
BLOCK_M = 64                # packed query rows per CTA: one wgmma M
BLOCK_N = SCHED_BLOCK       # cache rows per tile (64): a tile never straddles two pieces
TPR = THREADS // BLOCK_M    # Q copy: threads per query row
XCHG = 2 * BLOCK_M          # floats: a row statistic of each warpgroup


def tile_cols(head_dim, head_dim_v):
    """(QW, KW): columns of the Q tile and of a cache buffer (V, then the P block)."""
    qw = wgmma.padded_cols(head_dim)
    return qw, max(qw, 2 * value_cols(head_dim_v) + wgmma.BLOCK_COLS)


def shared_bytes(head_dim, head_dim_v):
    """Dynamic shared memory of one CTA (with the alignment reserve)."""
    qw, kw = tile_cols(head_dim, head_dim_v)
    return 2 * (BLOCK_M * qw + 2 * BLOCK_N * kw) + wgmma.TILE_ALIGN


def release_sets(head_dim, head_dim_v):
    """The boxes (64-column blocks loaded by TMA) of each buffer, by who releases them, in
    order: ``((A released by warpgroup 0, by 1), (B released by 1, by 0))``. The owner of a tile
    releases what only it reads once its rs product is done; the other warpgroup releases its
    own V half and the P block after its ss product."""
    qw, _ = tile_cols(head_dim, head_dim_v)
    boxes, vhb = qw // wgmma.BLOCK_COLS, value_cols(head_dim_v) // wgmma.BLOCK_COLS
    half = (set(range(vhb)), set(range(vhb, 2 * vhb)))  # V columns of warpgroup 0, 1
    p_block = 2 * vhb
    sets = []
    for owner in range(2):
        late = half[1 - owner] | {p_block}
        sets.append((tuple(c for c in range(boxes) if c not in late),
                     tuple(c for c in range(boxes) if c in late)))
    return tuple(sets)


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT):
    """Python kernel function for one configuration (``SPEC`` compiles it, for sm_90a)."""
    assert FMT in ("float16", "bfloat16") and supports(HEAD_DIM, HEAD_DIM_V)
    QW, KW = tile_cols(HEAD_DIM, HEAD_DIM_V)
    VH = value_cols(HEAD_DIM_V)
    KSTEPS = HEAD_DIM // 16      # k-steps of Q K^T
    NT = BLOCK_N // 8            # 8-key tiles of S
    DT = VH // 8                 # 8-column tiles of a warpgroup's O_i
    PSTEPS = BLOCK_N // 16       # k-steps of P V
    S_REGS, O_REGS = 4 * NT, 4 * DT
    Q_OFF = 0
    K_OFF = BLOCK_M * QW
    TILE = BLOCK_N * KW          # elements of one cache buffer
    BOX = BLOCK_N * wgmma.BLOCK_COLS
    P_AT = 2 * VH // wgmma.BLOCK_COLS * BOX  # the P block in a buffer
    BOXES = QW // wgmma.BLOCK_COLS  # boxes TMA loads into a buffer: HEAD_DIM's
    BOX_BYTES = 2 * BOX
    BARS = 2 * BOXES             # one mbarrier per box of each buffer
    CHUNKS = HEAD_DIM // 8       # 16-byte chunks of a Q row
    CPT = -(-CHUNKS // TPR)      # ... per copying thread
    CHUNKS_EXACT = CHUNKS % TPR == 0
    ((A_EARLY, A_LATE), (B_EARLY, B_LATE)) = release_sets(HEAD_DIM, HEAD_DIM_V)
    ALL_BOXES = (1 << BOXES) - 1
    A_FIRST, A_THEN, B_FIRST, B_THEN = (sum(1 << c for c in s)
                                        for s in (A_EARLY, A_LATE, B_EARLY, B_LATE))
    # Order of a warpgroup's S chain: the boxes of its buffer released first come first.
    ORDER = (A_EARLY + A_LATE, B_EARLY + B_LATE)
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(FMT, BLOCK_N, 0)    # S = Q K^T, K read K-major
    mma_pv = wgmma.mma_ss(FMT, VH, 1)        # O += P V, P from a P block, V read MN-major
    pack = convert.pack(FMT)
    copy16 = memory.cp_async_16_zfill
    shfl_xor = sync.shfl_xor
    row_max = make_row_max(1, NT)
    update = make_online_update(1, NT, DT)
    cta_work, piece_of, _, _, put, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT,
                                                                 True)
    start_rows, mask_keys = make_row_keys(CAUSAL, NT, DT)
    ZERO, ONE = float32(0.0), float32(1.0)
    NO_PAGE = int32(-1)
    NEG_INF = constants.NEG_INF

    # Descriptor arithmetic in 16-byte units (ptx/wgmma.py, "Shared-memory operands"): V's
    # 64-column blocks are BLOCK_N rows of 128 bytes apart, buffer 1 is TILE elements on.
    SBO, V_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    V_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES
    BUF_STEP = TILE * 2 // 16
    V_COLS_STEP = VH * BLOCK_N * 2 // 16             # warpgroup 1's V: VH columns on
    P_STEP = P_AT * 2 // 16

    @cuda.jit(device=True, inline="always")
    def chunk_at(i, even, odd):
        """Offset of this thread's Q chunk ``rl + 4 i`` in the swizzled Q tile (see
        ``tc/mla_decode_wgmma.py``)."""
        return (i >> 1) * BLOCK_M * wgmma.BLOCK_COLS + (odd if i & 1 else even)

    @cuda.jit(device=True, inline="always")
    def tile_shift(n0, n_hi):
        """Rows a tile's box starts before its first key: 64 - its keys, for a ragged last
        tile."""
        return max(n0 + BLOCK_N - n_hi, 0)

    @cuda.jit(device=True, inline="always")
    def load_boxes(smem, at, tmap, k_cache, bars, b, block_table, num_pages, req, n0, n_hi,
                   hk, page_size, status, boxes):
        """(One thread) The boxes in the bit mask ``boxes`` of the tile of keys n0 .. n0 + 63
        into buffer ``b`` at ``at``, box c completing on barrier ``b * BOXES + c``. A last tile
        with fewer keys is loaded ``tile_shift`` rows early, so its rows end at the piece end:
        the rows before it are keys of the same page (masked) or before the page (zeros), and
        no row past the piece end, whatever the page holds there, reaches P V."""
        blk = int32(convert.div_u32(n0, page_size))
        page = NO_PAGE
        if blk < block_table.shape[1]:
            entry = block_table[req, blk]
            if entry >= 0 and entry < num_pages:
                page = entry
            else:
                report(status, BAD_TABLE_ENTRY)
        else:
            report(status, PAST_TABLE)
        for c in range(BOXES):
            if (boxes >> c) & 1:
                tma.expect_tx(bars, b * BOXES + c, BOX_BYTES)
                tma.load_box_4d(smem, at + c * BOX, tmap, k_cache,
                                (int32(c * wgmma.BLOCK_COLS), hk,
                                 n0 - blk * page_size - tile_shift(n0, n_hi), page),
                                BLOCK_N, bars, b * BOXES + c)

    @cuda.jit(device=True, inline="always")
    def mask_before(S, skip):
        """Keys before the tile: S's first ``skip`` columns (past this thread's t2) -> -inf."""
        for nt in range(NT):
            for e in range(4):
                if 8 * nt + (e & 1) < skip:
                    S[0, nt, e] = NEG_INF

    def mla_decode_pairs(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                         o_acc, lse_acc, status, s_q, group, page_size, scale_log2, tmap):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        xchg = cuda.shared.array(XCHG, float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        bars = cuda.shared.array(BARS, uint64)
        tid = cuda.threadIdx.x
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
        if tid == 0:
            tma.tensormap_acquire(tmap)
            for b in range(BARS):
                tma.mbarrier_init(bars, b, 1)
            tma.mbarrier_init_fence()
        cuda.syncthreads()
        parity = 0  # bit b: the parity of the next load of buffer b
        elected = (tid & (WARPGROUP - 1)) == 0  # issues the TMA copies of its warpgroup
        base = wgmma.aligned_base(smem)  # the tiles start on a 1024-byte boundary
        r_lo = 16 * (warp & 3) + g  # this thread's rows of the C fragments: r_lo, r_lo + 8

        desc_q = wgmma.descriptor(smem, base + Q_OFF, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO)
        desc_p = wgmma.descriptor(smem, base + K_OFF, 16, SBO) + uint64(P_STEP)
        desc_v = wgmma.descriptor(smem, base + K_OFF, V_LBO, SBO) + uint64(wg * V_COLS_STEP)
        own = uint64(wg * BUF_STEP)
        other = uint64((1 - wg) * BUF_STEP)
        p_words = (base + K_OFF + wg * TILE + P_AT) >> 1  # this warpgroup's P block, in words

        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        m_tile = cuda.local.array((1, 2), float32)
        limit = cuda.local.array(2, int32)
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits, part,
                                                       req, begin_req, end_req)
            n_tiles = (n_hi - n_lo + BLOCK_N - 1) // BLOCK_N if n_hi > n_lo else 0
            cuda.syncthreads()  # the previous piece is done with Q, both buffers, the exchange

            # Prologue: Q, and tiles 0 and 1 whole. This thread copies chunks rl, rl + 4, ...
            # (TPR = 4) of Q's row ``row``: packed row m0 + row, token tq, head hq.
            row = tid // TPR
            rl = tid % TPR
            even = row * wgmma.BLOCK_COLS + ((rl ^ (row & 7)) << 3)
            odd = row * wgmma.BLOCK_COLS + (((rl + 4) ^ (row & 7)) << 3)
            gq = m0 + row
            q_ok = gq < q_rows
            tq = int32(convert.div_u32(gq, group)) if q_ok else int32(0)
            hq = int32(hk * group + gq - tq * group) if q_ok else int32(0)
            for i in range(CPT):
                if CHUNKS_EXACT or rl + TPR * i < CHUNKS:
                    copy16(smem, base + Q_OFF + chunk_at(i, even, odd), q,
                           (req, tq, hq, uint64(8 * (rl + TPR * i))), q_ok)
            memory.cp_async_commit()
            if tid == 0:
                for t in range(2):
                    if t < n_tiles:
                        load_boxes(smem, base + K_OFF + t * TILE, tmap, k_cache, bars, t,
                                   block_table, num_pages, req, n_lo + t * BLOCK_N, n_hi, hk,
                                   page_size, status, ALL_BOXES)
            # Keys each of the thread's rows may see: the piece's, and (causal) those before its
            # token's diagonal.
            start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, m0 + r_lo)
            memory.cp_async_wait(0)  # Q has landed ...
            sync.proxy_fence()       # ... is visible to wgmma reads ...
            cuda.syncthreads()       # ... for every thread

            for pair in range((n_tiles + 1) // 2):
                t_own = 2 * pair + wg
                has_b = 2 * pair + 1 < n_tiles
                mine = wg == 0 or has_b
                n_own = n_lo + t_own * BLOCK_N

                # 1. S_own = Q K_own^T over all HEAD_DIM columns, box by box as they land.
                if mine:
                    wgmma.fence()
                    for i in range(BOXES):
                        c = ORDER[wg][i]
                        tma.wait(bars, wg * BOXES + c, (parity >> wg) & 1)
                        for kk in range(4):
                            ks = 4 * c + kk
                            if ks < KSTEPS:
                                mma_s(S, 0, desc_q + k_step(ks, BLOCK_M),
                                      desc_k + own + k_step(ks, BLOCK_N), i > 0 or kk > 0,
                                      smem, scratch, tid)
                    wgmma.commit()
                    wgmma.wait(0)
                    wgmma.fence_operands(S, S_REGS)
                parity ^= 3 if has_b else 1  # tile A always, tile B where there is one
                skip = tile_shift(n_own, n_hi)  # (a ragged last tile's box starts early)
                mask_keys(S, limit, n_own - skip + t2)  # keys past the row's limit (all, if
                if skip > 0:                            # not mine), and before the tile
                    mask_before(S, skip - t2)
                row_max(S, m_tile, shfl_scratch, tid)

                # 2. Both tiles' maxima -> one m_i in both warpgroups; S_own -> P_own.
                if t2 == 0:
                    for half in range(2):
                        xchg[BLOCK_M * wg + r_lo + 8 * half] = m_tile[0, half]
                cuda.syncthreads()  # (both S chains are done: the P blocks are free)
                for half in range(2):
                    r = r_lo + 8 * half
                    m_tile[0, half] = max(xchg[r], xchg[BLOCK_M + r])
                update(S, m_i, l_i, O_i, m_tile, scale_log2)

                # 3. P_own, 16-bit, into the P block of its buffer (the A operand of both
                # warpgroups' products with this tile).
                for nt in range(NT):
                    for half in range(2):
                        word = uint32(wgmma.tile_offset(r_lo + 8 * half, 8 * nt + t2, BLOCK_N))
                        smem_words[p_words + (word >> 1)] = pack(S[0, nt, 2 * half],
                                                                 S[0, nt, 2 * half + 1])
                sync.proxy_fence()
                cuda.syncthreads()  # both P blocks written

                # 4. O_i[:, own] += P_own V_own[:, own], then += P_other V_other[:, own]. Without
                # a tile B, warpgroup 1 has no own product and warpgroup 0 no other one.
                if mine:
                    wgmma.fence()
                    for kk in range(PSTEPS):
                        mma_pv(O_i, 0, desc_p + own + k_step(kk, BLOCK_M),
                               desc_v + own + uint64(kk * V_STEP), 1, smem, scratch, tid)
                    wgmma.commit()
                if wg == 1 or has_b:
                    wgmma.fence()
                    for kk in range(PSTEPS):
                        mma_pv(O_i, 0, desc_p + other + k_step(kk, BLOCK_M),
                               desc_v + other + uint64(kk * V_STEP), 1, smem, scratch, tid)
                    wgmma.commit()

                # Release: the own tile's boxes only this warpgroup reads once the rs product
                # is done, then the other tile's boxes it read in the ss product.
                wgmma.wait(1)
                if mine and t_own + 2 < n_tiles:
                    sync.warpgroup_sync(wg, shfl_scratch)  # all four warps past their reads
                if elected and mine and t_own + 2 < n_tiles:
                    load_boxes(smem, base + K_OFF + wg * TILE, tmap, k_cache, bars, wg,
                               block_table, num_pages, req, n_own + 2 * BLOCK_N, n_hi, hk,
                               page_size, status, A_FIRST if wg == 0 else B_FIRST)
                wgmma.wait(0)
                wgmma.fence_operands(O_i, O_REGS)
                t_other = 2 * pair + 1 - wg
                if t_other + 2 < n_tiles:
                    sync.warpgroup_sync(wg, shfl_scratch)
                if elected and t_other + 2 < n_tiles:
                    load_boxes(smem, base + K_OFF + (1 - wg) * TILE, tmap, k_cache, bars, 1 - wg,
                               block_table, num_pages, req, n_lo + (t_other + 2) * BLOCK_N,
                               n_hi, hk, page_size, status, B_THEN if wg == 0 else A_THEN)

            # Epilogue: the row sums of both warpgroups, then O_i / l_i and the lse (final or
            # partial) straight from the fragments.
            for mask in (1, 2):
                for half in range(2):
                    l_i[0, half] += shfl_xor(l_i[0, half], mask, shfl_scratch, tid)
            if t2 == 0:  # (every thread read the last maxima before the last P barrier)
                for half in range(2):
                    xchg[BLOCK_M * wg + r_lo + 8 * half] = l_i[0, half]
            cuda.syncthreads()
            for half in range(2):
                r = r_lo + 8 * half
                gr = m0 + r
                if gr < q_rows:
                    l = xchg[r] + xchg[BLOCK_M + r]
                    inv = ONE / l if l > ZERO else ZERO
                    t = int32(convert.div_u32(gr, group))
                    h = hk * group + gr - t * group
                    for dt in range(DT):
                        for e in range(2):
                            col = VH * wg + 8 * dt + t2 + e
                            if col < HEAD_DIM_V:
                                put(out, o_acc, split, req, slot, t, h, col,
                                    O_i[0, dt, 2 * half + e] * inv, status)
                    if wg == 0 and t2 == 0:
                        put_lse(lse, lse_acc, split, req, slot, t, h, m_i[0, half] * scale_log2,
                                l, status)

    return mla_decode_pairs


# ----------------------------------------------------------------------------- spec

class Spec(DecodeSpec):
    name = "mla_decode_pairs"
    unroll_loops = True

    def entry(self, config, device):
        return ()  # one tile shape: BLOCK_M = BLOCK_N = 64, two warpgroups

    def tiles(self, config, entry):
        return Tiles(BLOCK_M, BLOCK_N, THREADS, shared_bytes(config.head_dim, config.head_dim_v))

    def signature(self, config):
        return types.void(*super().signature(config).args, types.Array(types.uint64, 1, "A"))

    def arguments(self, config, p):
        return super().arguments(config, p) + (tma_maps.box_map(p["k_cache"], BLOCK_N),)

    def make(self, config, tiles):
        return make_mla_decode_kernel(config.head_dim, config.head_dim_v, config.causal,
                                      config.fmt)


SPEC = Spec()
