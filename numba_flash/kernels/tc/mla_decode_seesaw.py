"""Paged MLA decode on Hopper's warpgroups with FlashMLA's "seesaw": each warpgroup scores its
own tile of a pair while the other multiplies.

What it computes
    The function of ``tc/mla_decode_wgmma.py`` (read it first: the packed query rows, Q resident
    in shared memory, V as the first HEAD_DIM_V columns of each 64-key cache tile, the pieces,
    partials and the combine are the same), with another division of the work between its two
    warpgroups. There, both warpgroups go through every phase of every tile together (each
    scores 32 of its keys, then both exchange maxima, write P, multiply P V), so the tensor
    cores idle whenever the CTA is in a softmax or at a barrier. Here the tiles come in pairs
    (a = 2p, b = 2p + 1): warpgroup 0 scores all 64 keys of tile a, warpgroup 1 those of tile
    b, and each keeps its half of O_i's columns (O_L, O_R) as before:

        WG0: softmax(S_a) from WG1's last maximum -> P_a into shared memory for WG1 as it is,
             O_L += P_a V_a[:, L] (P from registers); then, with WG1's new maximum: O_L moved
             to it, O_L += P_b V_b[:, L] (P_b from shared memory), score tile a + 2 (its
             first half issued right behind that product, so the tensor cores have work
             across the wait)
        WG1: O_R moved to WG0's new maximum, O_R += P_a V_a[:, R] (shared) -> softmax(S_b)
             from WG0's maximum -> P_b into shared memory for WG0, O_R += P_b V_b[:, R]
             (shared), score tile b + 2

    The running maximum crosses through shared memory in one direction per pair (WG0 -> WG1 ->
    WG0 at the next pair), with the rescale factors beside it. P_a stays at WG0's maximum: WG1
    adds P_a V_a before it moves O_R on to its own, which it seldom does (below), so the rescale
    between its two chains waits for the first only in the warps with a row that moved. The
    tensor cores thus take the products in the order their buffer halves are needed again:
    P_a V_a[:, L] and [:, R] (tile a + 2, which WG0 scores first), then P_b V_b. Named barriers
    (``sync.named_arrive`` / ``named_sync``, 256 threads) order the four hand-offs: scale 0
    ready, scale 1 ready, P_a stored, P_b stored; a fifth frees P_a's tile for the next pair.
    While one warpgroup is in its softmax the other's chains run. Warpgroup 0 arrives on "scale
    0 ready" before its own softmax in the source (warpgroup 1 needs only the maxima and
    factors), but ptxas schedules most of the softmax's exponentials ahead of the arrive: a
    barrier arrive orders memory, not arithmetic (docs/perf-notes.md).

    The shared maximum moves lazily, as in ``common/softmax.py``: only when a tile's row
    maximum passes it by more than RESCALE_LOG2 (base 2), so P stays below 2^8 and after the
    first tiles the factors are almost always 1; each 128-multiply rescale of O_i (two per
    warpgroup and pair) is skipped by the threads whose two factors are both 1 (3-4% at every
    point of the decode grid, docs/perf-notes.md).

Grid / block mapping
    As ``mla_decode_wgmma.py``: grid (scheduler parts, h_kv, ceil(q_rows / 64)), 256 threads.
    Per thread: S of a whole tile (32 floats), its half of O_i (VH / 2 floats), and the 64 rope
    columns of Q (the last 64-column block, 16 registers): the S chains read that block from
    registers (an rs wgmma), which frees it in shared memory for P_b.

Memory pipeline
    TMA only (page sizes that are multiples of 64). A cache buffer is refilled in two halves:
    the V columns of O_L (boxes 0 .. VB - 1) and the rope block, which only S chains read, by
    warpgroup 0 as soon as its products on them are done, O_R's V columns by warpgroup 1 after
    its product on them. Each 64-column box has its own mbarrier, so an S chain waits box
    by box and starts on the first one to land. Buffer 0 holds the even tiles, buffer 1 the odd
    ones. Rows past the piece end are zeroed in the V columns by the scoring warpgroup before its
    barrier hands the tile on.

Shared memory: the layout of ``decode_tiles.py`` (Q, two cache tiles, one P tile: 225 KiB at
    576 / 512), P_b in Q's rope block; 448 static floats for the maxima, scale factors and
    sums, and one mbarrier per box of each buffer (18 at 576).

Limits
    As ``mla_decode_wgmma.py``, and Q's last 64-column block must lie past the V columns
    (HEAD_DIM > 2 VH, as DeepSeek's 576 / 512); page sizes that are multiples of 64.
"""

from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32, uint64

from ...runtime import tma as tma_maps
from ...runtime.spec import SM90A, Sample, Tiles
from ..attention import TC_DECODE_SAMPLES, DecodeSpec
from ..common import constants
from ..common.paged_kv import make_page_lookup, make_paged_kv_walk, make_piece_out, make_row_keys
from ..common.softmax import make_moving_max, make_row_max
from ..instructions import convert, memory, sync, tma, wgmma
from .decode_tiles import (BLOCK_M, BLOCK_N, MAX_HEAD_DIM, MAX_HEAD_DIM_V, THREADS, TPR,
                           WARPGROUP, shared_layout, tile_cols, value_cols)

SHARED_ALIGN = memory.SHARED_ALIGN
# Named barriers (0 is syncthreads'): the four hand-offs between the warpgroups, one that
# frees P_a's tile for the next pair (PA_FREE), and one per warpgroup (OWN + wg) before a buffer
# half its products read is refilled (a warp's wgmma.wait covers its own part of the product
# only) and after it zeroed rows.
SCALE0, SCALE1, P_A, P_B, PA_FREE, OWN = 1, 2, 3, 4, 5, 6


def supports(head_dim, head_dim_v):
    """Whether the seesaw takes these head dims: Q's last column block is not V."""
    qw, _ = tile_cols(head_dim, head_dim_v)
    return (head_dim % 16 == 0 and head_dim <= MAX_HEAD_DIM and head_dim_v <= MAX_HEAD_DIM_V
            and qw - wgmma.BLOCK_COLS >= 2 * value_cols(head_dim_v))


NO_PAGE = int32(-1)  # page -1: TMA boxes of zeros


@lru_cache(maxsize=None)
def make_refills(HEAD_DIM, HEAD_DIM_V):
    """The refills of the cache buffers by halves ("Memory pipeline"), by one thread each:

        entry_of(block_table, req, n0, page_size)   the table entry of key n0's page
        load_half(smem, base, buf, tmap, k_cache, bars, block_table, entry, num_pages, n0, hk,
                  page_size, status, half)   half ``half`` of the tile of keys n0 .. n0 + 63
        half_boxes(half), half_box(half, i)          the boxes of a half
    """
    QW, KW = tile_cols(HEAD_DIM, HEAD_DIM_V)
    BOXES = QW // wgmma.BLOCK_COLS
    VB = value_cols(HEAD_DIM_V) // wgmma.BLOCK_COLS  # boxes of O_L's V columns: buffer half 0
    K_OFF = shared_layout(HEAD_DIM, HEAD_DIM_V).k
    TILE = BLOCK_N * KW
    BOX = BLOCK_N * wgmma.BLOCK_COLS
    table_entry, page_of, _ = make_page_lookup(NO_PAGE)
    @cuda.jit(device=True, inline="always")
    def entry_of(block_table, req, n0, page_size):
        """The block-table entry of the page that holds key n0 as it is stored (``load_half``
        checks it). Read well before its use: a test of the loaded value here would wait for
        the load."""
        return table_entry(block_table, req, int32(convert.div_u32(n0, page_size)))

    @cuda.jit(device=True, inline="always")
    def load_half(smem, base, buf, tmap, k_cache, bars, block_table, entry, num_pages, n0, hk,
                  page_size, status, half):
        """(One thread) half ``half`` of the tile of keys n0 .. n0 + 63 into cache buffer ``buf``
        (``half_boxes``), box c completing on its own mbarrier (buf BOXES + c) so that an S chain
        can start on the first box to land; ``entry``: its ``entry_of``, which if bad reads
        page -1 (zeros)."""
        blk = int32(convert.div_u32(n0, page_size))
        page, _ = page_of(entry, blk, block_table, num_pages, status)
        for i in range(half_boxes(half)):
            c = half_box(half, i)
            bar = buf * BOXES + c
            tma.expect_tx(bars, bar, 2 * BOX)
            tma.load_box_4d(smem, base + K_OFF + buf * TILE + c * BOX, tmap, k_cache,
                            (int32(c * wgmma.BLOCK_COLS), hk, n0 - blk * page_size, page),
                            BLOCK_N, bars, bar)

    @cuda.jit(device=True, inline="always")
    def half_boxes(half):
        """The boxes of a buffer half: half 0 holds O_L's V columns and the rope block (which
        only S chains read, so it is free as early as they are), half 1 O_R's V columns."""
        return VB + 1 if half == 0 else BOXES - 1 - VB

    @cuda.jit(device=True, inline="always")
    def half_box(half, i):
        """Box ``i`` of half ``half`` (``half_boxes``)."""
        if half == 0:
            return i if i < VB else BOXES - 1
        return VB + i

    return entry_of, load_half, half_boxes, half_box


@lru_cache(maxsize=None)
def make_scores(HEAD_DIM, HEAD_DIM_V, FMT):
    """S = Q K^T of the tile in a warpgroup's buffer, box by box as the boxes land:

        half_scores(S, half, first, buf, parity, rope, bars, smem, scratch, tid)  (not committed)
        scores_done(S)                          wait for the warpgroup's chain
        score_own_tile(S, rope, bars, wg, phase, tile, n_lo, n_hi, smem, smem_words, base,
                       scratch, lt, tid)        -> the buffer's next phase
        zero_tail(smem_words, base, tile, n_lo, n_hi, lt, wg, tid)   V rows past the piece end
    """
    QW, KW = tile_cols(HEAD_DIM, HEAD_DIM_V)
    BOXES = QW // wgmma.BLOCK_COLS
    LAYOUT = shared_layout(HEAD_DIM, HEAD_DIM_V)
    Q_OFF, K_OFF = LAYOUT.q, LAYOUT.k
    TILE = BLOCK_N * KW
    BUF_STEP = TILE * 2 // 16
    V_WORDS = value_cols(HEAD_DIM_V)     # 32-bit words of a row's 2 VH V columns
    S_REGS = 4 * (BLOCK_N // 8)
    mma_s = wgmma.mma_ss(FMT, BLOCK_N, 0)       # S = Q K^T over the shared blocks
    mma_s_rope = wgmma.mma_rs(FMT, BLOCK_N, 0)  # ... and the rope block from registers
    k_step, desc, operand_low = wgmma.k_step, wgmma.descriptor_join, wgmma.operand_low
    named_sync = sync.named_sync
    _, _, half_boxes, half_box = make_refills(HEAD_DIM, HEAD_DIM_V)
    @cuda.jit(device=True, inline="always")
    def half_scores(S, half, first, buf, parity, rope, bars, smem, scratch, tid):
        """The k-steps of S = Q K^T over half ``half`` of cache buffer ``buf`` (half 0 ends with
        the rope block, from registers), each box's as soon as its mbarrier completed the phase
        of ``parity``; ``first``: the chain's first k-step overwrites S. Not committed."""
        low_q = operand_low(smem, Q_OFF, 16)
        low_k = operand_low(smem, K_OFF, 16) + uint32(buf * BUF_STEP)
        wgmma.fence()
        for i in range(half_boxes(half)):
            c = half_box(half, i)
            tma.wait(bars, buf * BOXES + c, parity)
            wgmma.fence()  # a wait between a chain's wgmma: fence after it
            for kk in range(4):
                ks = 4 * c + kk
                if c < BOXES - 1:
                    mma_s(S, 0, desc(low_q + uint32(k_step(ks, BLOCK_M))),
                          desc(low_k + uint32(k_step(ks, BLOCK_N))), not first or i + kk > 0,
                          smem, scratch, tid)
                else:
                    mma_s_rope(S, 0, (rope[kk, 0], rope[kk, 1], rope[kk, 2], rope[kk, 3]),
                               desc(low_k + uint32(k_step(ks, BLOCK_N))), 1, smem, scratch, tid)

    @cuda.jit(device=True, inline="always")
    def scores_done(S):
        """Wait for this warpgroup's S chain (everything it has in flight)."""
        wgmma.commit()
        wgmma.wait(0)
        wgmma.fence_operands(S, S_REGS)

    @cuda.jit(device=True, inline="always")
    def own_scores(S, rope, bars, wg, parity, smem, scratch, tid):
        """S of the tile in this warpgroup's buffer (``wg``): first the half this warpgroup
        refilled itself (issued earlier), then the other one."""
        if wg == 0:
            half_scores(S, 0, True, 0, parity, rope, bars, smem, scratch, tid)
            half_scores(S, 1, False, 0, parity, rope, bars, smem, scratch, tid)
        else:
            half_scores(S, 1, True, 1, parity, rope, bars, smem, scratch, tid)
            half_scores(S, 0, False, 1, parity, rope, bars, smem, scratch, tid)
        scores_done(S)

    @cuda.jit(device=True, inline="always")
    def zero_rows_past(smem_words, at, valid, lt, wg, tid):
        """This warpgroup's threads zero the V columns of rows ``valid`` .. 63 of the tile at
        ``at`` and publish them (their P is 0, but a NaN there would reach O as 0 * NaN). The
        first barrier: every warp's part of the S chain that read these rows is done."""
        named_sync(OWN + wg, WARPGROUP, tid)
        for w in range(lt, (BLOCK_N - valid) * V_WORDS, WARPGROUP):
            r = valid + w // V_WORDS
            col = 2 * (w - (r - valid) * V_WORDS)
            smem_words[uint32(at + wgmma.tile_offset(r, col, BLOCK_N)) >> 1] = uint32(0)
        sync.proxy_fence()
        named_sync(OWN + wg, WARPGROUP, tid)

    @cuda.jit(device=True, inline="always")
    def zero_tail(smem_words, base, tile, n_lo, n_hi, lt, wg, tid):
        """After this warpgroup scored ``tile`` (in its buffer ``wg``): the V rows past the piece
        end zeroed."""
        valid = int32(n_hi - (n_lo + tile * BLOCK_N))
        if valid < BLOCK_N:
            zero_rows_past(smem_words, base + K_OFF + wg * TILE, valid, lt, wg, tid)

    @cuda.jit(device=True, inline="always")
    def score_own_tile(S, rope, bars, wg, phase, tile, n_lo, n_hi, smem, smem_words, base,
                       scratch, lt, tid):
        """S of ``tile`` (in this warpgroup's buffer) in one go, then its V rows past the piece
        end zeroed; returns the buffer's next phase."""
        own_scores(S, rope, bars, wg, phase, smem, scratch, tid)
        next_phase = phase ^ 1
        zero_tail(smem_words, base, tile, n_lo, n_hi, lt, wg, tid)
        return next_phase

    return half_scores, scores_done, score_own_tile, zero_tail


@lru_cache(maxsize=None)
def make_p_tiles(HEAD_DIM, HEAD_DIM_V, FMT):
    """P in shared memory and the operands of P V:

        v_operand(smem, cols, kk), p_operand(smem, at, kk)   a k-step's B and A descriptors
        store_p(smem_words, at, S, r_lo, t2)                 P from S into a P tile
        pack_a(A, S), store_a(smem_words, at, A, r_lo, t2)   P as rs A registers; those into a
                                                             P tile
    """
    NT, KK = BLOCK_N // 8, BLOCK_N // 16
    K_OFF = shared_layout(HEAD_DIM, HEAD_DIM_V).k
    V_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES
    V_STEP, k_step, desc = wgmma.MN_K_STEP, wgmma.k_step, wgmma.descriptor_join
    operand_low = wgmma.operand_low
    pack = convert.pack(FMT)
    @cuda.jit(device=True, inline="always")
    def v_operand(smem, cols, kk):
        """Descriptor of k-step ``kk`` of P V's B operand, V columns ``cols`` (16-byte units)
        on; each wgmma's operands are made from their own ``operand_low``, which keeps them in
        uniform registers (made once for a chain, ptxas moved them from vector ones)."""
        return desc(operand_low(smem, K_OFF, V_LBO) + cols + kk * V_STEP)

    @cuda.jit(device=True, inline="always")
    def p_operand(smem, at, kk):
        """Descriptor of k-step ``kk`` of a P tile at element ``at`` (P V's A operand)."""
        return desc(operand_low(smem, at, 16) + uint32(k_step(kk, BLOCK_M)))

    @cuda.jit(device=True, inline="always")
    def store_p(smem_words, at, S, r_lo, t2):
        """P (float32 fragments) rounded to 16 bits into the 64 x 64 P tile at ``at``."""
        for nt in range(NT):
            for half in range(2):
                word = uint32(at + wgmma.tile_offset(r_lo + 8 * half, 8 * nt + t2, BLOCK_M)) >> 1
                smem_words[word] = pack(S[0, nt, 2 * half], S[0, nt, 2 * half + 1])
        sync.proxy_fence()

    @cuda.jit(device=True, inline="always")
    def store_a(smem_words, at, A, r_lo, t2):
        """P from its rs A registers (already 16-bit pairs) into the P tile at ``at``."""
        for kk in range(KK):
            for i in range(4):
                smem_words[uint32(at + wgmma.tile_offset(r_lo + 8 * (i & 1),
                                                         16 * kk + 8 * (i >> 1) + t2,
                                                         BLOCK_M)) >> 1] = A[kk, i]
        sync.proxy_fence()

    @cuda.jit(device=True, inline="always")
    def pack_a(A, S):
        """P rounded to 16 bits as the A registers of an rs wgmma, keys 16 kk .. 16 kk + 15 in
        A[kk] (the accumulator and A-fragment layouts line up). All of them before the chain:
        a register written between a warpgroup's wgmma makes ptxas fence and serialize them
        (C7519)."""
        for kk in range(KK):
            A[kk, 0] = pack(S[0, 2 * kk, 0], S[0, 2 * kk, 1])
            A[kk, 1] = pack(S[0, 2 * kk, 2], S[0, 2 * kk, 3])
            A[kk, 2] = pack(S[0, 2 * kk + 1, 0], S[0, 2 * kk + 1, 1])
            A[kk, 3] = pack(S[0, 2 * kk + 1, 2], S[0, 2 * kk + 1, 3])

    return v_operand, p_operand, store_p, store_a, pack_a


@lru_cache(maxsize=None)
def make_pair_steps(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT):
    """The phases of a pair of tiles a = 2p, b = a + 1 (the module docstring's seesaw) between
    the refills the kernel issues: warpgroup 0's ``wg0_tile_a``, ``wg0_tile_b`` (-> the parity
    its next scores wait for) and ``wg0_next_scores`` (-> its buffer's next phase), warpgroup
    1's ``wg1_tiles``."""
    VH = value_cols(HEAD_DIM_V)
    NT, DT = BLOCK_N // 8, VH // 8
    KK = BLOCK_N // 16                   # k-steps of P V
    O_REGS = 4 * DT
    LAYOUT = shared_layout(HEAD_DIM, HEAD_DIM_V)
    P_OFF = LAYOUT.p                     # P_a
    ROPE = LAYOUT.q + (tile_cols(HEAD_DIM, HEAD_DIM_V)[0] // wgmma.BLOCK_COLS - 1) \
        * BLOCK_M * wgmma.BLOCK_COLS     # Q's last block: P_b's home
    V_COLS_STEP = VH * BLOCK_N * 2 // 16  # O_R's V columns: VH columns on
    mma_o = wgmma.mma_ss(FMT, VH, 1)            # O += P V, P from shared memory
    mma_o_regs = wgmma.mma_rs(FMT, VH, 1)       # O += P V, P from registers
    named_sync, named_arrive = sync.named_sync, sync.named_arrive
    row_max = make_row_max(1, NT)
    moved_max, rescale, exponentiate, _ = make_moving_max(NT, DT)
    _, mask_keys = make_row_keys(CAUSAL, NT, DT)
    half_scores, scores_done, _, zero_tail = make_scores(HEAD_DIM, HEAD_DIM_V, FMT)
    v_operand, p_operand, store_p, store_a, pack_a = make_p_tiles(HEAD_DIM, HEAD_DIM_V, FMT)
    ONE = float32(1.0)

    @cuda.jit(device=True, inline="always")
    def wg0_tile_a(S, O_i, l_i, m_tile, m_new, scale, P16, m_sh, scale_sh, limit, smem,
                   smem_words, scratch, shfl_scratch, base, n_lo, p, a, scale_log2, r_lo, t2,
                   tid):
        """Softmax of tile a from warpgroup 1's last maximum, P_a for warpgroup 1, and O_L +=
        P_a V_a[:, L] done in every warp of the warpgroup."""
        mask_keys(S, limit, int32(n_lo + a * BLOCK_N + t2))
        row_max(S, m_tile, shfl_scratch, tid)
        for half in range(2):
            r = r_lo + 8 * half
            mn, scale[half] = moved_max(m_sh[1, r], m_tile[0, half], scale_log2)
            m_new[half] = mn
            if t2 == 0:
                m_sh[0, r] = mn
                scale_sh[0, r] = scale[half]
        named_arrive(SCALE0, THREADS, tid)
        rescale(O_i, l_i, scale)
        exponentiate(S, m_new, l_i, scale_log2)
        pack_a(P16, S)
        # P_a for warpgroup 1 as it is, at this warpgroup's maximum (warpgroup 1
        # adds P_a V_a before it moves O_R on to its own), once its last P_a V_a is
        # done: the tensor cores then take warpgroup 1's P_a V_a[:, R] right after
        # this warpgroup's O_L += P_a V_a[:, L], P_a from registers.
        if p > 0:
            named_sync(PA_FREE, THREADS, tid)
        store_a(smem_words, base + P_OFF, P16, r_lo, t2)
        named_arrive(P_A, THREADS, tid)
        wgmma.fence()
        for kk in range(KK):
            mma_o_regs(O_i, 0, (P16[kk, 0], P16[kk, 1], P16[kk, 2], P16[kk, 3]),
                       v_operand(smem, 0, kk), 1, smem, scratch, tid)
        wgmma.commit()
        wgmma.wait(0)
        wgmma.fence_operands(O_i, O_REGS)
        named_sync(OWN, WARPGROUP, tid)  # every warp's part of the product is done

    @cuda.jit(device=True, inline="always")
    def wg0_tile_b(S, O_i, l_i, scale, scale_sh, rope, bars, smem, scratch, v_b, phase, next_a,
                   r_lo, tid):
        """O_L moved to warpgroup 1's maximum, that of P_b; O_L += P_b V_b[:, L] with the
        first half of tile a + 2's scores behind it, done down to those scores. Returns the
        parity they wait for."""
        named_sync(SCALE1, THREADS, tid)
        for half in range(2):
            scale[half] = scale_sh[1, r_lo + 8 * half]
        rescale(O_i, l_i, scale)
        # O_L += P_b V_b[:, L], P_b from shared memory (without a tile b, P_b = 0
        # times tile a's V: a branch around the chain would serialize it).
        named_sync(P_B, THREADS, tid)
        wgmma.fence()
        for kk in range(KK):
            mma_o(O_i, 0, p_operand(smem, ROPE, kk), v_operand(smem, v_b, kk), 1,
                  smem, scratch, tid)
        wgmma.commit()
        # Tile a + 2's first half right behind it: the tensor cores keep work while
        # this warpgroup waits for the older chain and hands buffer 1's half 0 back.
        # Without a tile a + 2 the chain runs on tile a's rows, waits for no phase
        # (the parity of the one completed last) and is dropped: a branch around it
        # made ptxas serialize every wgmma (C7518).
        parity = phase if next_a else phase ^ 1
        half_scores(S, 0, True, 0, parity, rope, bars, smem, scratch, tid)
        wgmma.commit()
        wgmma.wait(1)
        wgmma.fence_operands(O_i, O_REGS)
        named_sync(OWN, WARPGROUP, tid)
        return parity

    @cuda.jit(device=True, inline="always")
    def wg0_next_scores(S, rope, bars, smem, smem_words, scratch, base, parity, phase, next_a,
                        a, n_lo, n_hi, lt, tid):
        """The second half of tile a + 2's scores, and its V rows past the piece end zeroed;
        returns the buffer's next phase."""
        half_scores(S, 1, False, 0, parity, rope, bars, smem, scratch, tid)
        scores_done(S)
        if next_a:
            phase ^= 1
            zero_tail(smem_words, base, a + 2, n_lo, n_hi, lt, 0, tid)
        return phase

    @cuda.jit(device=True, inline="always")
    def wg1_tiles(S, O_i, l_i, m_tile, m_new, scale, carry, m_sh, scale_sh, limit, smem,
                  smem_words, scratch, shfl_scratch, base, n_lo, a, v_b, scale_log2, r_lo, t2,
                  tid):
        """Softmax of tile b from warpgroup 0's new maximum (all -inf past the end), O_R +=
        P_a V_a[:, R] and P_b V_b[:, R]; returns once the first of the two is done."""
        named_sync(SCALE0, THREADS, tid)
        # (no tile b: its keys lie past every row's limit, so all of S is -inf)
        mask_keys(S, limit, int32(n_lo + (a + 1) * BLOCK_N + t2))
        row_max(S, m_tile, shfl_scratch, tid)
        for half in range(2):
            r = r_lo + 8 * half
            mn, scale[half] = moved_max(m_sh[0, r], m_tile[0, half], scale_log2)
            m_new[half] = mn
            carry[half] = scale_sh[0, r]  # O_R was at this warpgroup's last maximum
            if t2 == 0:
                m_sh[1, r] = mn
                scale_sh[1, r] = scale[half]  # warpgroup 0 moves by this
        named_arrive(SCALE1, THREADS, tid)
        # O_R += P_a V_a[:, R] at warpgroup 0's maximum, P_a from shared memory,
        # first: its end frees buffer 0's half 1, which tile a + 2 needs next.
        rescale(O_i, l_i, carry)
        named_sync(P_A, THREADS, tid)
        wgmma.fence()
        for kk in range(KK):
            mma_o(O_i, 0, p_operand(smem, P_OFF, kk), v_operand(smem, V_COLS_STEP, kk),
                  1, smem, scratch, tid)
        wgmma.commit()
        # O_R and l_i on to this warpgroup's maximum: where a row's moved (seldom
        # after the first tiles), its warp waits for the chain first.
        if sync.warp_any(scale[0] != ONE or scale[1] != ONE, shfl_scratch, tid):
            wgmma.wait(0)
            wgmma.fence_operands(O_i, O_REGS)
            rescale(O_i, l_i, scale)
        exponentiate(S, m_new, l_i, scale_log2)
        store_p(smem_words, base + ROPE, S, r_lo, t2)
        named_arrive(P_B, THREADS, tid)
        # O_R += P_b V_b[:, R], P_b from shared memory too: from registers, they
        # would stay pinned under the chain through the refill below (ptxas spilled).
        named_sync(OWN + 1, WARPGROUP, tid)
        wgmma.fence()
        for kk in range(KK):
            mma_o(O_i, 0, p_operand(smem, ROPE, kk),
                  v_operand(smem, V_COLS_STEP + v_b, kk), 1, smem, scratch, tid)
        wgmma.commit()
        wgmma.wait(1)
        named_sync(OWN + 1, WARPGROUP, tid)

    return wg0_tile_a, wg0_tile_b, wg0_next_scores, wg1_tiles


@lru_cache(maxsize=None)
def make_piece_ends(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT):
    """(prologue_copies, prologue_rows, finish_piece): a piece's prologue (Q and its first tiles
    in flight; the row state, the rope registers) and epilogue (O_i / l_i and the lse out)."""
    QW, _ = tile_cols(HEAD_DIM, HEAD_DIM_V)
    VH = value_cols(HEAD_DIM_V)
    NT, DT = BLOCK_N // 8, VH // 8
    LAYOUT = shared_layout(HEAD_DIM, HEAD_DIM_V)
    Q_OFF = LAYOUT.q
    ROPE = Q_OFF + (QW // wgmma.BLOCK_COLS - 1) * BLOCK_M * wgmma.BLOCK_COLS  # P_b's home
    CHUNKS = HEAD_DIM // 8
    CPT = -(-CHUNKS // TPR)
    CHUNKS_EXACT = CHUNKS % TPR == 0
    copy16 = memory.cp_async_16_zfill
    shfl_xor = sync.shfl_xor
    _, _, _, _, _, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, True)
    start_rows, _ = make_row_keys(CAUSAL, NT, DT)
    stage, write = make_piece_out(HEAD_DIM_V, VH, BLOCK_M, THREADS // 32, FMT)
    entry_of, load_half, _, _ = make_refills(HEAD_DIM, HEAD_DIM_V)
    NEG_INF = constants.NEG_INF
    ZERO, ONE = float32(0.0), float32(1.0)

    @cuda.jit(device=True, inline="always")
    def prologue_copies(q, k_cache, block_table, tmap, bars, smem, req, n_lo, n_tiles, fresh,
                        group, q_rows, m0, hk, num_pages, page_size, base, status, tid):
        # The row of Q this thread copies, its chunks, and its token and head.
        row = tid // TPR + fresh
        rl = tid % TPR
        even = row * wgmma.BLOCK_COLS + ((rl ^ (row & 7)) << 3)
        odd = row * wgmma.BLOCK_COLS + (((rl + 4) ^ (row & 7)) << 3)
        gq = m0 + row
        q_ok = gq < q_rows
        tq = int32(convert.div_u32(gq, group)) if q_ok else int32(0)
        hq = int32(hk * group + gq - tq * group) if q_ok else int32(0)

        # Prologue: Q by cp.async; tiles 0 and 1, all boxes, by thread 0.
        for i in range(CPT):
            if CHUNKS_EXACT or rl + TPR * i < CHUNKS:
                copy16(smem, base + Q_OFF + (i >> 1) * BLOCK_M * wgmma.BLOCK_COLS
                       + (odd if i & 1 else even), q,
                       (req, tq, hq, uint64(8 * (rl + TPR * i) + fresh)), q_ok)
        memory.cp_async_commit()
        if tid == 0:
            for t in range(min(n_tiles, 2)):
                entry = entry_of(block_table, req, n_lo + t * BLOCK_N, page_size)
                for half in range(2):
                    load_half(smem, base, t, tmap, k_cache, bars, block_table, entry,
                              num_pages, n_lo + t * BLOCK_N, hk, page_size, status, half)

    @cuda.jit(device=True, inline="always")
    def prologue_rows(smem_words, m_sh, rope, limit, m_unused, l_unused, O_i, l_i, n_hi, seqlen,
                      s_q, group, m0, fresh, base, r_lo, t2, tid):
        """The rows' state reset; once Q has landed, its rope block into registers."""
        start_rows(limit, m_unused, l_unused, O_i, n_hi, seqlen, s_q, group, m0 + r_lo)
        for half in range(2):
            l_i[half] = ZERO
        if tid < BLOCK_M:
            m_sh[1, tid] = NEG_INF  # "warpgroup 1's maximum" before the first pair
        memory.cp_async_wait(0)
        sync.proxy_fence()
        cuda.syncthreads()
        # The rope block of Q as rs A fragments (the layout of make_pack_a's P).
        for kk in range(4):
            for i in range(4):
                rope[kk, i] = smem_words[uint32(base + ROPE + fresh + wgmma.tile_offset(
                    r_lo + 8 * (i & 1), 16 * kk + 8 * (i >> 1) + t2, BLOCK_M)) >> 1]

    @cuda.jit(device=True, inline="always")
    def finish_piece(out, lse, o_acc, lse_acc, smem, smem_words, smem_f32, l_sh, m_sh,
                     shfl_scratch, O_i, l_i, req, split, slot, fresh, base, q_rows, group, m0,
                     hk, scale_log2, wg, warp, lane, r_lo, t2, status, tid):
        # Epilogue: the row sums of both warpgroups (one maximum: warpgroup 1's last), then
        # O_i / l_i staged over Q and the tiles (nothing is in flight there now) and copied
        # out by rows; the lse straight from the fragments.
        for mask in (1, 2):
            for half in range(2):
                l_i[half] += shfl_xor(l_i[half], mask, shfl_scratch, tid)
        if t2 == 0:
            for half in range(2):
                l_sh[wg, r_lo + 8 * half] = l_i[half]
        cuda.syncthreads()  # ... and every warpgroup's wgmma reads of the tiles are done
        for half in range(2):
            r = r_lo + 8 * half
            l = l_sh[0, r] + l_sh[1, r]
            inv = ONE / l if l > ZERO else ZERO
            stage(smem_words, smem_f32, (base >> 1) + fresh, O_i, VH * wg, r, half, t2, inv,
                  split)
            gr = m0 + r + fresh
            if wg == 0 and t2 == 0 and gr < q_rows:
                t = int32(convert.div_u32(gr, group))
                put_lse(lse, lse_acc, split, req, slot, t, hk * group + gr - t * group,
                        m_sh[1, r] * scale_log2, l, status)
        cuda.syncthreads()
        write(out, o_acc, smem, smem_f32, (base >> 1) + fresh, split, req, slot, m0 + fresh,
              q_rows, group, hk, warp, lane, status)
        sync.proxy_fence()  # these reads before the next piece's copies into the tiles

    return prologue_copies, prologue_rows, finish_piece


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT):
    """Python kernel function for one configuration (``SPEC`` compiles it, for sm_90a)."""
    assert FMT in ("float16", "bfloat16") and supports(HEAD_DIM, HEAD_DIM_V)
    QW, KW = tile_cols(HEAD_DIM, HEAD_DIM_V)
    NT, DT = BLOCK_N // 8, value_cols(HEAD_DIM_V) // 8
    KK = BLOCK_N // 16                   # k-steps of P V
    O_REGS = 4 * DT
    N_BARS = 2 * (QW // wgmma.BLOCK_COLS)  # one mbarrier per box of each cache buffer
    BUF_STEP = BLOCK_N * KW * 2 // 16
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    cta_work, piece_of, _, _, _, _ = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, True)
    named_sync, named_arrive = sync.named_sync, sync.named_arrive
    entry_of, load_half, _, _ = make_refills(HEAD_DIM, HEAD_DIM_V)
    _, _, score_own_tile, _ = make_scores(HEAD_DIM, HEAD_DIM_V, FMT)
    wg0_tile_a, wg0_tile_b, wg0_next_scores, wg1_tiles = make_pair_steps(HEAD_DIM, HEAD_DIM_V,
                                                                          CAUSAL, FMT)
    prologue_copies, prologue_rows, finish_piece = make_piece_ends(HEAD_DIM, HEAD_DIM_V, CAUSAL,
                                                                   FMT)

    def mla_decode_seesaw(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                          o_acc, lse_acc, status, s_q, group, page_size, scale_log2, tmap):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        smem_f32 = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)  # ... again
        m_sh = cuda.shared.array((2, BLOCK_M), float32)      # the maxima each warpgroup set
        scale_sh = cuda.shared.array((2, BLOCK_M), float32)  # ... and the factor they moved by
        l_sh = cuda.shared.array((2, BLOCK_M), float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        bars = cuda.shared.array(N_BARS, uint64)  # buffer b, box c: mbarrier b BOXES + c
        tid = cuda.threadIdx.x
        # The combine may launch now (it waits for this grid before it reads the partials): its
        # launch and its CTAs for the requests no part splits run alongside this grid.
        sync.launch_dependents()
        wg = sync.warp_uniform(tid >> 7)  # a uniform branch for ptxas: no C7519
        lt = tid & (WARPGROUP - 1)
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        begin_req, end_req = int32(begin_req), int32(end_req)  # 32-bit: one register each
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        if lt == 0:
            tma.tensormap_acquire(tmap)  # both issuing threads read the map
        if tid == 0:
            for i in range(N_BARS):
                tma.mbarrier_init(bars, i, 1)
            tma.mbarrier_init_fence()
        cuda.syncthreads()
        phase = 0  # the parity of this warpgroup's buffer's next phase (all its boxes alike)
        base = wgmma.aligned_base(smem)
        r_lo = 16 * (warp & 3) + g

        m_new = cuda.local.array(2, float32)
        scale = cuda.local.array(2, float32)
        carry = cuda.local.array(2, float32)
        l_i = cuda.local.array(2, float32)
        limit = cuda.local.array(2, int32)
        m_tile = cuda.local.array((1, 2), float32)
        m_unused = cuda.local.array((1, 2), float32)  # start_rows resets these; m, l live apart
        l_unused = cuda.local.array((1, 2), float32)
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)
        rope = cuda.local.array((4, 4), uint32)
        P16 = cuda.local.array((KK, 4), uint32)  # P as rs A registers

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, _, _ = piece_of(metadata, cache_seqlens, num_splits, part, req,
                                                begin_req, end_req, status)
            # Warp-uniform for ptxas, like wg: the wgmma under branches on it stay asynchronous.
            n_tiles = sync.warp_uniform(
                int32((n_hi - n_lo + BLOCK_N - 1) // BLOCK_N if n_hi > n_lo else 0))
            cuda.syncthreads()  # the previous piece is done with Q, P and the exchanges
            # 0, but not to ptxas: the addresses that depend on it (Q's copies, the rope loads,
            # the outputs) stay in the request loop, where hoisted out of it they held about 60
            # registers for the whole kernel and spilled 232 bytes.
            fresh = n_tiles >> 31
            prologue_copies(q, k_cache, block_table, tmap, bars, smem, req, n_lo, n_tiles, fresh,
                            group, q_rows, m0, hk, num_pages, page_size, base, status, tid)
            prologue_rows(smem_words, m_sh, rope, limit, m_unused, l_unused, O_i, l_i, n_hi,
                          seqlen, s_q, group, m0, fresh, base, r_lo, t2, tid)

            # Each warpgroup scores the first tile of its buffer (warpgroup 1: -inf if none).
            if wg < n_tiles:
                phase = score_own_tile(S, rope, bars, wg, phase, wg, n_lo, n_hi, smem, smem_words,
                                       base, scratch, lt, tid)

            n_pairs = (n_tiles + 1) // 2
            for p in range(n_pairs):
                a = 2 * p
                has_b = a + 1 < n_tiles
                next_a = a + 2 < n_tiles
                next_b = a + 3 < n_tiles
                # V of tile b, or (no tile b: P_b = 0) tile a's finite one: never stale rows.
                v_b = uint32(BUF_STEP if has_b else 0)
                # The table entries of tiles a + 2 and a + 3, read by the threads that issue
                # their boxes now: the loads' latency passes under this pair's softmax instead
                # of delaying the refills that the other warpgroup's next scores wait for.
                entry_a, entry_b = NO_PAGE, NO_PAGE
                if lt == 0:
                    if next_a:
                        entry_a = entry_of(block_table, req, int32(n_lo + (a + 2) * BLOCK_N),
                                           page_size)
                    if next_b:
                        entry_b = entry_of(block_table, req, int32(n_lo + (a + 3) * BLOCK_N),
                                           page_size)
                if wg == 0:
                    wg0_tile_a(S, O_i, l_i, m_tile, m_new, scale, P16, m_sh, scale_sh, limit,
                               smem, smem_words, scratch, shfl_scratch, base, n_lo, p, a,
                               scale_log2, r_lo, t2, tid)
                    if tid == 0 and next_a:  # V_a[:, L] is done with: tile a + 2's half 0
                        load_half(smem, base, 0, tmap, k_cache, bars, block_table, entry_a,
                                  num_pages, int32(n_lo + (a + 2) * BLOCK_N), hk, page_size,
                                  status, 0)
                    parity = wg0_tile_b(S, O_i, l_i, scale, scale_sh, rope, bars, smem, scratch,
                                        v_b, phase, next_a, r_lo, tid)
                    if tid == 0 and next_b:
                        load_half(smem, base, 1, tmap, k_cache, bars, block_table, entry_b,
                                  num_pages, int32(n_lo + (a + 3) * BLOCK_N), hk, page_size,
                                  status, 0)
                    phase = wg0_next_scores(S, rope, bars, smem, smem_words, scratch, base,
                                            parity, phase, next_a, a, n_lo, n_hi, lt, tid)
                else:
                    wg1_tiles(S, O_i, l_i, m_tile, m_new, scale, carry, m_sh, scale_sh, limit,
                              smem, smem_words, scratch, shfl_scratch, base, n_lo, a, v_b,
                              scale_log2, r_lo, t2, tid)
                    # Half 1 of buffer 0 (V_a[:, R]) and P_a's tile as soon as the first
                    # product is done, half 1 of buffer 1 after the second.
                    if lt == 0 and next_a:
                        load_half(smem, base, 0, tmap, k_cache, bars, block_table, entry_a,
                                  num_pages, int32(n_lo + (a + 2) * BLOCK_N), hk, page_size,
                                  status, 1)
                    if p + 1 < n_pairs:
                        named_arrive(PA_FREE, THREADS, tid)
                    wgmma.wait(0)
                    wgmma.fence_operands(O_i, O_REGS)
                    named_sync(OWN + 1, WARPGROUP, tid)
                    if lt == 0 and next_b:
                        load_half(smem, base, 1, tmap, k_cache, bars, block_table, entry_b,
                                  num_pages, int32(n_lo + (a + 3) * BLOCK_N), hk, page_size,
                                  status, 1)
                    if next_b:  # tile b + 2 (in buffer 1)
                        phase = score_own_tile(S, rope, bars, 1, phase, a + 3, n_lo, n_hi, smem,
                                               smem_words, base, scratch, lt, tid)

            # (read again here: kept from the start, the two were live through every tile)
            _, _, _, split, slot = piece_of(metadata, cache_seqlens, num_splits, part, req,
                                            begin_req, end_req, status)
            finish_piece(out, lse, o_acc, lse_acc, smem, smem_words, smem_f32, l_sh, m_sh,
                         shfl_scratch, O_i, l_i, req, split, slot, fresh, base, q_rows, group, m0,
                         hk, scale_log2, wg, warp, lane, r_lo, t2, status, tid)

    return mla_decode_seesaw



class Spec(DecodeSpec):
    name = "mla_decode_seesaw"
    allows_dependents = True
    unroll_loops = True

    def entry(self, config, device):
        return ()

    def tiles(self, config, entry):
        return Tiles(BLOCK_M, BLOCK_N, THREADS,
                     shared_layout(config.head_dim, config.head_dim_v).bytes)

    def signature(self, config):
        return types.void(*super().signature(config).args, types.Array(types.uint64, 1, "A"))

    def arguments(self, config, p):
        return super().arguments(config, p) + (tma_maps.box_map(p["k_cache"], BLOCK_N),)

    def make(self, config, tiles):
        assert config.tma
        return make_mla_decode_kernel(config.head_dim, config.head_dim_v, config.causal,
                                      config.fmt)

    def samples(self):
        return [Sample(f"tc wgmma mla seesaw {label} tma", (*config, True, True), ccs=(SM90A,))
                for label, config in TC_DECODE_SAMPLES if supports(*config[1:3])]


SPEC = Spec()
