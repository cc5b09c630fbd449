"""FlashAttention forward on Hopper, warp-specialized: a producer warp feeds K/V tiles with TMA
through a ring of mbarrier-guarded stages while consumer warpgroups run wgmma and the softmax,
each overlapping its softmax of tile j with the tensor cores' work on tiles j + 1 and j - 1.

What it computes
    The function of ``forward_wgmma.py`` (read it first: the wgmma products, the online softmax
    with lazy rescaling, the causal and window rules, the epilogue are the same), for dense and
    packed varlen batches (paged K/V stays with ``forward_wgmma.py``, whose row table takes any
    page size). What changes is who does what, and when (FlashAttention-3's design, the
    chapter's "warp specialization" and "intra-warpgroup pipelining"):

    * Warpgroup 0 is the *producer*. One of its threads issues every copy: Q once, then for
      each key tile a TMA box copy of K_j into stage ``j % STAGES`` and one of V_j, each
      completing an mbarrier (``K_FULL``, ``V_FULL``) with its byte count. Before reusing a
      stage it waits on that stage's ``K_EMPTY`` / ``V_EMPTY`` barrier, on which every
      consumer warp arrives once it no longer reads the tile. No consumer thread computes a
      copy address; the copies run ahead by STAGES tiles, bounded by the ring alone.
    * ``setmaxnreg``: the producer needs a few registers, the consumers' accumulators many. The
      CTA is launched at 65536 / threads registers per thread (168 for three warpgroups); the
      producer drops to 24 and each consumer rises to what that frees (240 for two consumers).
      ptxas honors this only in a whole-program compile (``SPEC.lto``, runtime/compiler.py).
    * Consumer warpgroups (BLOCK_M / 64 of them, 64 query rows each) overlap within
      themselves. At key tile j a warpgroup issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}
      as two asynchronous wgmma batches, waits for the first only (``wgmma.wait(1)``), and runs
      the mask and the softmax of S_j while the tensor cores still multiply P_{j-1} V_{j-1}.
      The softmax may move a row's maximum; l_i moves at once, O_i only after the product on
      it has completed (``wgmma.wait(0)``): its registers belong to the tensor cores until
      then. P_j is packed to 16-bit pairs (the A fragments of the next PV) only after that
      wait too: the product in flight reads P_{j-1} from the same registers (ptxas would
      otherwise serialize the batches, C7513).
    * Ping-pong between consumer warpgroups (``PINGPONG``): named barriers pass a turn around
      the warpgroups, and each issues its two batches only in its turn, so the tensor cores
      take the warpgroups' batches one after the other and one warpgroup's softmax runs under
      the other's products, rather than all softmaxes at once (the last warpgroup passes the
      first turn; the first takes the last pass after its loop, so every barrier's arrivals
      match).

Grid / block mapping
    As ``forward_wgmma.py``: grid = (ceil(Sq / BLOCK_M), B * Hq), causal query tiles numbered
    from the last. Block = (1 + BLOCK_M / 64) warpgroups; consumer warpgroup c (warpgroup c + 1)
    owns query rows 64 c .. 64 c + 63 of the tile, its warp w the 16 from 64 c + 16 w. Per
    consumer thread: S (BLOCK_N / 2 floats), P packed (BLOCK_N / 4 words), O_i (DPAD / 2
    floats), two rows' m_i, l_i.

Memory pipeline
    TMA boxes of 64 columns (128 bytes, the swizzle's row) by the tile's rows, from tensor maps
    of q, k, v built once per array (runtime/tma.py); columns past HEAD_DIM and rows past the
    array's end arrive as zeros. Varlen batches are packed: a box may reach into the next
    sequence's rows, which the mask hides (keys) or the epilogue never writes (queries).
    Barriers: Q_FULL, and per stage K_FULL, V_FULL (one arrival: the producer's expect_tx,
    plus the bytes), K_EMPTY, V_EMPTY (one arrival per consumer warp). Phases: the r-th use
    of a stage (r = j // STAGES) waits for FULL's phase of parity r & 1; the producer's r-th
    refill waits for EMPTY's phase r - 1.

Shared memory (the 128-byte swizzle of ``forward_wgmma.py``)
    Q   BLOCK_M x DPAD          TMA'd once; at the end it stages O
    K   STAGES x BLOCK_N x DPAD
    V   STAGES x BLOCK_N x DPAD
    + 1 KiB alignment reserve; 5 STAGES + 1 mbarriers in a static array.
    e.g. HEAD_DIM 128, BLOCK_M 128, BLOCK_N 128, 2 stages: 32 + 4 x 32 + 1 = 161 KiB.

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 8 up to 256; any Sq, Sk; q, k, v whose rows are
    16-byte aligned with strides of whole 16 bytes (a tensor map's rule: validate checks it);
    compute capability 9.0 (sm_90a). The window, softcap, ALiBi and the sink (``WINDOW``,
    ``SOFTCAP``, ``ALIBI``, ``SINK``) as in ``forward_wgmma.py``, through the same pieces.
"""

from dataclasses import replace
from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32, uint64

from ...runtime import tma as tma_maps
from ...runtime.spec import SM90A, Tiles
from ..attention import HALF_FORMATS, ForwardSpec, sample
from ..instructions import convert, memory, sync, tma, wgmma
from ..common.epilogue import lse_of, make_row_writer
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import make_kv_end, make_seqlen_info, make_window
from ..common.score_mods import make_score_mods, make_sink
from ..common.softmax import make_moving_max, make_row_max, make_score_mask

SHARED_ALIGN = memory.SHARED_ALIGN
WARPGROUP = wgmma.WARPGROUP
BOX_COLS = wgmma.BLOCK_COLS
PRODUCER_REGS = 24
# Named barriers (0 is syncthreads'): every consumer's wgmma reads of Q are behind it; then one
# per consumer warpgroup, its turn to issue (ping-pong).
CONSUMERS_DONE, TURN = 1, 2


def padded_head_dim(head_dim):
    return wgmma.padded_cols(head_dim)


def shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, STAGES):
    """Q and the K, V rings, in 16-bit elements from the aligned base, with the alignment
    reserve; the epilogue stages O over Q."""
    dpad = padded_head_dim(HEAD_DIM)
    return SharedLayout(2, [("q", BLOCK_M * dpad), ("k", STAGES * BLOCK_N * dpad),
                            ("v", STAGES * BLOCK_N * dpad), ("o", BLOCK_M * dpad, "q")],
                        reserve=wgmma.TILE_ALIGN)


def register_split(consumers):
    """(launch, producer, consumer) registers per thread: the launch count 65536 / threads in
    whole 8s, the producer's 24, and what the rest leaves each consumer warpgroup."""
    launch = 65536 // ((consumers + 1) * WARPGROUP) // 8 * 8
    consumer = ((consumers + 1) * launch - PRODUCER_REGS) // consumers // 8 * 8
    return launch, PRODUCER_REGS, min(consumer, 256)


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PINGPONG, CAUSAL, FMT, VARLEN=False,
                        WINDOW=False, SOFTCAP=False, ALIBI=False, SINK=False):
    """Python kernel function for one configuration (``SPEC`` compiles it, for sm_90a)."""
    assert FMT in ("float16", "bfloat16") and BLOCK_M % 64 == 0 and BLOCK_N % 16 == 0
    CONSUMERS = BLOCK_M // 64
    PINGPONG = PINGPONG and CONSUMERS > 1  # one warpgroup has no one to take turns with
    CONSUMER_THREADS = CONSUMERS * WARPGROUP
    CONSUMER_WARPS = CONSUMER_THREADS // 32
    THREADS = CONSUMER_THREADS + WARPGROUP
    _, P_REGS, C_REGS = register_split(CONSUMERS)
    DPAD = padded_head_dim(HEAD_DIM)
    BOXES = DPAD // BOX_COLS     # 64-column boxes of a tile
    KSTEPS = DPAD // 16          # k-steps of Q K^T
    NT = BLOCK_N // 8            # 8-column tiles of S
    KK = NT // 2                 # 16-key steps of P V
    DT = DPAD // 8               # 8-column tiles of O
    S_REGS, O_REGS = 4 * NT, 4 * DT
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
    Q_OFF, K_OFF, V_OFF, O_OFF = lay.q, lay.k, lay.v, lay.o
    TILE = BLOCK_N * DPAD        # elements of one K (or V) stage
    # mbarriers: Q_FULL, then STAGES each of K_FULL, V_FULL, K_EMPTY, V_EMPTY.
    Q_FULL, K_FULL, V_FULL = 0, 1, 1 + STAGES
    K_EMPTY, V_EMPTY = 1 + 2 * STAGES, 1 + 3 * STAGES
    NBARS = 1 + 4 * STAGES
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(FMT, BLOCK_N, 0)   # S = Q K^T, K read K-major
    mma_o = wgmma.mma_rs(FMT, DPAD, 1)      # O += P V, V read MN-major
    pack = convert.pack(FMT)
    shfl_xor = sync.shfl_xor
    seqlen_info = make_seqlen_info(VARLEN)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    key_window = make_window(BLOCK_M, BLOCK_N, WINDOW)[0]
    mask_scores = make_score_mask(1, NT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW, SOFTCAP, ALIBI)
    row_max = make_row_max(1, NT)
    moved_max, _, exponentiate, rescale_out = make_moving_max(NT, DT)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    sink_start = make_sink(False, SINK)
    write_rows = make_row_writer(HEAD_DIM, BLOCK_M)
    ZERO, ONE = float32(0.0), float32(1.0)

    SBO, V_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    V_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES
    STAGE_STEP = TILE * 2 // 16  # a stage in descriptor units (16 bytes)

    @cuda.jit(device=True, inline="always")
    def load_tile(smem, at, tmap, src, tb, row, hk, rows, bars, i):
        """The producer's copies of ``rows`` rows from ``row`` of src[tb, :, hk, :] into the
        tile at ``at``, one box per 64 columns, completing on barrier ``i``."""
        tma.expect_tx(bars, i, rows * DPAD * 2)
        for c in range(BOXES):
            tma.load_box_4d(smem, at + c * rows * BOX_COLS, tmap, src,
                            (int32(c * BOX_COLS), hk, row, tb), rows, bars, i)

    @cuda.jit(device=True, inline="always")
    def release(bars, i, lane, tid):
        """One arrival per consumer warp on barrier ``i``: the warp's part of the product that
        read the stage is done (its lanes meet first: the wait of each covers its own)."""
        sync.syncwarp(tid)
        if lane == 0:
            tma.arrive(bars, i)

    @cuda.jit(device=True, inline="always")
    def take_turn(c, tid):
        """Ping-pong (``PINGPONG``): consumer warpgroup c issues its products only after the one
        before it in the round has issued its own, so the tensor cores take the warpgroups'
        batches in turn and each one's softmax runs under the others' products."""
        if PINGPONG:
            sync.named_sync(TURN + c, 2 * WARPGROUP, tid)

    @cuda.jit(device=True, inline="always")
    def pass_turn(c, tid):
        if PINGPONG:
            sync.named_arrive(TURN + (c + 1) % CONSUMERS, 2 * WARPGROUP, tid)

    @cuda.jit(device=True, inline="always")
    def issue_scores(S, j, desc_q, desc_k, bars, smem, scratch, tid):
        """S = Q K_j^T as one batch of KSTEPS wgmma, once K_j has landed."""
        s = j % STAGES
        tma.wait(bars, K_FULL + s, (j // STAGES) & 1)
        buf = uint64(s * STAGE_STEP)
        for ks in range(KSTEPS):
            mma_s(S, 0, desc_q + k_step(ks, BLOCK_M), desc_k + buf + k_step(ks, BLOCK_N),
                  ks > 0, smem, scratch, tid)
        wgmma.commit()

    @cuda.jit(device=True, inline="always")
    def issue_values(O_i, P, j, desc_v, bars, smem, scratch, tid):
        """O_i += P_j V_j as one batch, 16 keys per wgmma, P from registers, once V_j has
        landed."""
        s = j % STAGES
        tma.wait(bars, V_FULL + s, (j // STAGES) & 1)
        buf = uint64(s * STAGE_STEP)
        for kk in range(KK):
            mma_o(O_i, 0, (P[kk, 0], P[kk, 1], P[kk, 2], P[kk, 3]),
                  desc_v + buf + uint64(kk * V_STEP), 1, smem, scratch, tid)
        wgmma.commit()

    @cuda.jit(device=True, inline="always")
    def softmax(S, m_i, l_i, m_tile, factor, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                scale_log2, mods, shfl_scratch, tid):
        """Mask S_j, move m_i lazily (``factor``: what O_i owes the move), rescale l_i, and
        turn S_j into P_j (float32)."""
        mask_scores(S, n0, m0, row_g, t2, seqlen_k, diag, diag_lo, mods)
        row_max(S, m_tile, shfl_scratch, tid)
        for half in range(2):
            m_new, f = moved_max(m_i[half], m_tile[0, half], scale_log2)
            m_i[half] = m_new
            factor[half] = f
            l_i[half] *= f
        exponentiate(S, m_i, l_i, scale_log2)

    @cuda.jit(device=True, inline="always")
    def pack_p(S, P):
        """P_j rounded to 16 bits and packed in pairs: the A fragments of its product. Only
        once the product before has completed: a wgmma in flight reads its A registers."""
        for kk in range(KK):
            P[kk, 0] = pack(S[0, 2 * kk, 0], S[0, 2 * kk, 1])
            P[kk, 1] = pack(S[0, 2 * kk, 2], S[0, 2 * kk, 3])
            P[kk, 2] = pack(S[0, 2 * kk + 1, 0], S[0, 2 * kk + 1, 1])
            P[kk, 3] = pack(S[0, 2 * kk + 1, 2], S[0, 2 * kk + 1, 3])

    def flash_fwd_wgmma_ws(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                           cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table,
                           window_left, window_right, softcap, alibi_slopes, sink, q_map, k_map,
                           v_map):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        bars = cuda.shared.array(NBARS, uint64)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        tid = cuda.threadIdx.x
        wg = sync.warp_uniform(tid >> 7)  # a uniform branch: ptxas keeps the wgmma unserialized
        base = wgmma.aligned_base(smem)
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x) * BLOCK_M
        b = int32(convert.div_u32(bh, n_heads_q))
        h = bh - b * n_heads_q
        hk = int32(convert.div_u32(h, group))
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k,
            seqused_k, status)
        if VARLEN and m0 >= seqlen_q:
            return  # a query tile past the sequence's end: the whole CTA leaves together
        tb = 0 if VARLEN else b  # the batch coordinate of the copies: packed rows are entry 0's
        # Sliding window: keys from the first tile it reaches, diagonals relative to it.
        n_start, diag_hi, diag_lo = key_window(m0, diag, seqlen_k, window_left, window_right,
                                               BLOCK_N)
        rel0 = diag - n_start  # turns a row and a key of the view back into i + diag - j
        diag = diag_hi
        seqlen_k -= n_start
        end = kv_end(m0, diag, seqlen_k)  # causal: the key tiles past the diagonal are skipped
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0
        if VARLEN:  # read from memory: ptxas would treat loops over it as divergent (C7519)
            n_tiles = sync.warp_uniform(n_tiles)

        if tid == 0:
            for i in range(NBARS):
                tma.mbarrier_init(bars, i, CONSUMER_WARPS if i >= K_EMPTY else 1)
            tma.mbarrier_init_fence()
        cuda.syncthreads()

        if wg == 0:
            # ------------------------------------------------------------------ producer
            sync.regs_decrease(P_REGS)
            if tid == 0:
                tma.tensormap_acquire(q_map)
                tma.tensormap_acquire(k_map)
                tma.tensormap_acquire(v_map)
                load_tile(smem, base + Q_OFF, q_map, q, tb, q0 + m0, h, BLOCK_M, bars, Q_FULL)
                row = k0 + n_start
                for j in range(n_tiles):
                    s = j % STAGES
                    at = s * TILE
                    if j >= STAGES:  # the stage's previous tile is no longer read
                        tma.wait(bars, K_EMPTY + s, ((j // STAGES) & 1) ^ 1)
                    load_tile(smem, base + K_OFF + at, k_map, k, tb, row, hk, BLOCK_N, bars,
                              K_FULL + s)
                    if j >= STAGES:
                        tma.wait(bars, V_EMPTY + s, ((j // STAGES) & 1) ^ 1)
                    load_tile(smem, base + V_OFF + at, v_map, v, tb, row, hk, BLOCK_N, bars,
                              V_FULL + s)
                    row += BLOCK_N
            return

        # ---------------------------------------------------------------------- consumers
        sync.regs_increase(C_REGS)
        ctid = tid - WARPGROUP     # thread of the consumers
        warp = ctid >> 5           # consumer warp: rows 16 warp .. of the tile
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
        row_g = m0 + 16 * warp + g  # global query index of this thread's first row

        desc_q = wgmma.descriptor(smem, base + Q_OFF + (wg - 1) * 64 * BOX_COLS, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO)
        desc_v = wgmma.descriptor(smem, base + V_OFF, V_LBO, SBO)

        m_i = cuda.local.array(2, float32)
        l_i = cuda.local.array(2, float32)
        m_tile = cuda.local.array((1, 2), float32)
        factor = cuda.local.array(2, float32)
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)
        P = cuda.local.array((KK, 4), uint32)  # P_{j-1} as the A fragments of P V
        m_start, l_start = sink_start(sink, h, scale_log2)  # a sink: a key already seen
        for half in range(2):
            m_i[half] = m_start
            l_i[half] = l_start if t2 == 0 else ZERO
        for dt in range(DT):
            for e in range(4):
                O_i[0, dt, e] = ZERO

        c = wg - 1
        if c == CONSUMERS - 1:
            pass_turn(c, tid)  # the first round starts with warpgroup 0
        tma.wait(bars, Q_FULL, 0)
        if n_tiles > 0:  # the first tile alone: S_0 and its softmax
            take_turn(c, tid)
            wgmma.fence()
            issue_scores(S, 0, desc_q, desc_k, bars, smem, scratch, tid)
            pass_turn(c, tid)
            wgmma.wait(0)
            wgmma.fence_operands(S, S_REGS)
            release(bars, K_EMPTY, lane, tid)
            softmax(S, m_i, l_i, m_tile, factor, 0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                    scale_log2, mods, shfl_scratch, tid)
            pack_p(S, P)
        for j in range(1, n_tiles):
            # S_j = Q K_j^T, then O += P_{j-1} V_{j-1} behind it on the tensor cores.
            take_turn(c, tid)
            wgmma.fence()
            issue_scores(S, j, desc_q, desc_k, bars, smem, scratch, tid)
            issue_values(O_i, P, j - 1, desc_v, bars, smem, scratch, tid)
            pass_turn(c, tid)
            wgmma.wait(1)  # S_j is done; P_{j-1} V_{j-1} may still run
            wgmma.fence_operands(S, S_REGS)
            release(bars, K_EMPTY + j % STAGES, lane, tid)
            # The softmax of S_j while the tensor cores finish the product on O_i; l_i and
            # m_i move now, O_i once its registers are the kernel's again.
            softmax(S, m_i, l_i, m_tile, factor, j * BLOCK_N, m0, row_g, t2, seqlen_k, diag,
                    diag_lo, scale_log2, mods, shfl_scratch, tid)
            wgmma.wait(0)
            wgmma.fence_operands(O_i, O_REGS)
            release(bars, V_EMPTY + (j - 1) % STAGES, lane, tid)
            pack_p(S, P)
            rescale_out(O_i, factor)
        if n_tiles > 0:  # the last product; no copy waits for its stage
            take_turn(c, tid)
            wgmma.fence()
            issue_values(O_i, P, n_tiles - 1, desc_v, bars, smem, scratch, tid)
            pass_turn(c, tid)
            wgmma.wait(0)
            wgmma.fence_operands(O_i, O_REGS)
        if c == 0:
            take_turn(c, tid)  # the last warpgroup's last pass, which no round takes

        # Epilogue, as in forward_wgmma.py, among the consumers: O_i / l_i staged over Q.
        sync.named_sync(CONSUMERS_DONE, CONSUMER_THREADS, tid)  # every read of Q is behind us
        for mask in (1, 2):
            for half in range(2):
                l_i[half] += shfl_xor(l_i[half], mask, shfl_scratch, tid)
        for half in range(2):
            l = l_i[half]
            inv = ONE / l if l > ZERO else ZERO
            row = 16 * warp + g + 8 * half
            for dt in range(DT):
                word = uint32(base + O_OFF + wgmma.tile_offset(row, 8 * dt + t2, BLOCK_M)) >> 1
                smem_words[word] = pack(O_i[0, dt, 2 * half] * inv, O_i[0, dt, 2 * half + 1] * inv)
        if VARLEN:
            out, lse = out[:, q0:], lse[:, :, q0:]
        if t2 == 0:
            for half in range(2):
                row = row_g + 8 * half
                if row < seqlen_q:
                    lse[b, h, row] = lse_of(m_i[half] * scale_log2, l_i[half])
        sync.named_sync(CONSUMERS_DONE, CONSUMER_THREADS, tid)
        write_rows(out, b, m0 + 16 * warp, h, seqlen_q, smem, base + O_OFF, 16 * warp, lane)

    return flash_fwd_wgmma_ws


# ----------------------------------------------------------------------------- spec

# (BLOCK_M, BLOCK_N) by head dim, non-causal and causal: FlashAttention-3's tiles, two stages,
# consumer warpgroups in ping-pong.
STAGES, PINGPONG = 2, True
TILES = ((64, ((192, 128), (192, 128))),
         (128, ((128, 128), (128, 128))),
         (256, ((128, 80), (128, 80))))

MAP = types.Array(types.uint64, 1, "A")


class Spec(ForwardSpec):
    name = "flash_fwd_wgmma_ws"
    unroll_loops = True
    lto = True  # setmaxnreg

    def entry(self, config, device):
        return next(t for limit, t in TILES if config.head_dim <= limit)[int(config.causal)]

    def tiles(self, config, entry):
        bm, bn = entry
        launch = register_split(bm // 64)[0]
        return Tiles(bm, bn, (bm // 64 + 1) * WARPGROUP,
                     shared_layout(bm, bn, config.head_dim, STAGES).bytes, launch)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, STAGES,
                                   PINGPONG,
                                   config.causal, config.fmt, config.varlen, config.window,
                                   config.softcap, config.alibi, config.sink)

    def signature(self, config):
        return types.void(*super().signature(config).args, MAP, MAP, MAP)

    def arguments(self, config, p):
        return super().arguments(config, p) + self._maps(config, p["q"], p["k"], p["v"])

    def pointer_tail(self, config, p, pointers):
        q, k, v = (replace(p[name], ptr=ptr) for name, ptr in zip("qkv", pointers))
        return tuple(m.ptr for m in self._maps(config, q, k, v))

    def _maps(self, config, q, k, v):
        """The tensor maps of q (boxes of BLOCK_M rows), k and v (BLOCK_N), kept per array
        (runtime/tma.py)."""
        tiles = self.choose(config, None)
        return (tma_maps.box_map(_packed(q), tiles.BLOCK_M),
                tma_maps.box_map(_packed(k), tiles.BLOCK_N),
                tma_maps.box_map(_packed(v), tiles.BLOCK_N))

    def samples(self):
        return [sample("tc wgmma ws fwd", (d, causal, fmt), entries[int(causal)], ccs=(SM90A,))
                for d, entries in TILES for causal in (False, True) for fmt in HALF_FORMATS]


def _packed(t):
    """A varlen batch's packed rows as the one batch entry they are: the kernels see them
    through a stride-0 view (``arrays.batched``), which a tensor map cannot describe."""
    if t.strides[0] == 0:
        return replace(t, shape=(1, *t.shape[1:]), strides=(t.shape[1] * t.strides[1],
                                                             *t.strides[1:]))
    return t


SPEC = Spec()
