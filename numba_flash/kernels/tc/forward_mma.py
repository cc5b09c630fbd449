"""FlashAttention forward on tensor cores: FA2 with ``mma.sync`` from pure Python.

What it computes
    The same function as ``kernels/simt/forward.py`` (read that one first: the algorithm, the
    online softmax and the causal rules are identical), but both matrix products run on the
    tensor cores as ``mma.sync.m16n8k16`` (16-bit inputs, float32 accumulation) issued through
    inline PTX (``kernels/ptx/mma.py``).
    One refinement over the textbook online softmax: m_i moves only when a row maximum exceeds
    it by more than 8 in base-2 units, a factor 256 in P (lazy rescaling, ``make_softmax_step``,
    which forward_wgmma.py shares), which skips the O_i rescale on almost every tile.

Grid / block mapping
    grid = (ceil(Sq / BLOCK_M), B * Hq), causal query tiles numbered from the last (the longest
    first, so the grid ends on short ones); block = NWARPS warps, BLOCK_M = 16 MT NWARPS. Warp
    ``w`` owns the MT m16 tiles of query rows ``16 MT w ..`` of the tile, and never talks to the
    other warps except through the shared K/V tiles. Inside a warp the ownership is the mma
    C-fragment layout: lane ``l`` holds rows ``l >> 2`` and ``(l >> 2) + 8`` of each m16 tile,
    columns ``2 (l & 3)`` and ``+1`` of every 8-column tile. So each thread keeps, in registers
    (times MT):

        Q fragments   4 words            (one k-step's A operand)
        S / P         NT x 4 floats      (BLOCK_N / 8 column tiles of S_ij)
        O_i           DT x 4 floats      (HEAD_DIM / 8 column tiles of the output)
        m_i, l_i      2 + 2 floats       (its two rows)
        m_tile        2 floats           (their maxima in the current S tile)

    Row maxima and sums need only the 4 lanes of a quad (``shfl_xor`` 1 and 2). P never leaves
    the registers: the C fragments of two adjacent 8-column tiles of S, rounded to 16 bits and
    packed in pairs, *are* the A fragment of the next product O += P V (kernels/ptx/mma.py
    explains why).
    These arrays stay in registers only because every loop that indexes them is unrolled
    completely: the kernel is compiled with ``unroll_loops`` (``runtime.compiler.mark_loops_for_unrolling``,
    CUDA C++'s ``#pragma unroll``); NVVM's own budget stops at about 32 mma per loop nest.

Memory pipeline
    K and V tiles go global -> shared with ``cp.async`` (16 bytes per instruction, no register
    round trip), double buffered with one barrier per tile: after the barrier that publishes
    tile j, every warp is past tile j - 1, so its buffer is refilled with tile j + 1 while tile
    j is computed. ldmatrix feeds the fragments: K as the B operand of Q K^T, V through
    ``.trans`` as the B operand of P V.

Shared memory (16-bit elements, dynamic; rows padded by 8 elements so the 8 row addresses of an
ldmatrix fall in 8 different 16-byte bank groups)
    Q   BLOCK_M x (DPAD + 8)         staged once; ldmatrix re-reads it every k-step (the
                                     registers go to S and O_i); at the end it stages O
    K   2 x BLOCK_N x (DPAD + 8)     double buffer
    V   2 x BLOCK_N x (DPAD + 8)     double buffer
    DPAD is HEAD_DIM rounded up to 16 (the k-step of mma); the padding columns are zero-filled.
    e.g. HEAD_DIM 128, BLOCK_M 128, BLOCK_N 64: 34 KiB + 2 x 2 x 17 KiB = 102 KiB, two blocks
    per SM on a Hopper (228 KiB; the ~254 registers of 128 threads allow two as well). Where
    two do not fit, the spec takes 32 keys (68 KiB).

Limits
    float16 / bfloat16 only (the tensor cores' inputs); HEAD_DIM a multiple of 8 up to 256; any
    Sq, Sk (ragged tiles are zero-filled and masked); compute capability 8.0 or newer. The tc
    backend runs it everywhere but on a Hopper, which runs ``forward_wgmma.py`` (the next step
    past this kernel: warpgroup MMA reading K and V straight from shared memory).
    Dense batches, or packed varlen sequences (``VARLEN``): each CTA takes its sequence's
    rows from ``common/masks.make_seqlen_info`` and returns when its tile lies past the
    sequence's end (kernels/attention.py). Paged K/V (``PAGED``, varlen): each K/V tile's rows
    come through a row table in shared memory (2 x BLOCK_N x 8 bytes more), written a tile ahead
    by one owner thread per row from the block table (``common/copies.make_paged_steps``).
    Sliding window (``WINDOW``): the causal code with the diagonal moved right and the keys
    viewed from the window's first tile, or page (``common/masks.make_key_view``); softcap and
    ALiBi (``SOFTCAP``, ``ALIBI``): each S element becomes the score the softmax sees before the
    masks (``common/score_mods.py``: ``cap_out tanh(S cap_in)``, then minus the slope times
    ``|i + diag - j|``, two instructions per element); a sink (``SINK``): each row starts as if
    it had seen a key of logit ``sink`` and value 0 (``m_i = sink``, ``l_i = 1``), so the
    sink joins the sum and the lse at no cost per tile. All compile-time options: off, they
    cost nothing.
"""

from functools import lru_cache

from numba import cuda, float32, uint16, uint32, uint64

from ...runtime.device import SHARED_RESERVED_PER_BLOCK
from ...runtime.spec import SM80, Tiles
from ..attention import HALF_FORMATS, ForwardSpec, sample
from ..instructions import convert, memory, sync
from ..instructions import mma as mma_sync
from ..common.copies import ROW_WORDS, make_paged_steps, make_tile_copy
from ..common.epilogue import lse_of, store_chunk
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import make_key_view, make_kv_end, make_seqlen_info
from ..common.score_mods import make_score_mods, make_sink
from ..common.softmax import make_softmax_step

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only

PAD = 8  # elements of row padding in shared memory (16 bytes)


def padded_head_dim(head_dim):
    return -(-head_dim // 16) * 16


def shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, PAGED=False):
    """Q and the K, V double buffers, in 16-bit elements (the module's "Shared memory"); the
    epilogue stages O over Q. Paged K/V adds the row table (two buffers of BLOCK_N rows of
    ROW_WORDS 32-bit words)."""
    stride = padded_head_dim(HEAD_DIM) + PAD
    rows = [("rows", 2 * BLOCK_N * ROW_WORDS * 2)] if PAGED else []
    return SharedLayout(2, [("q", BLOCK_M * stride), ("k", 2 * BLOCK_N * stride),
                            ("v", 2 * BLOCK_N * stride), *rows, ("o", BLOCK_M * stride, "q")])


def make_products(MT, NT, DT, KSTEPS, STRIDE, FMT):
    """The two products of a key tile, for a warp's MT m16 tiles of query rows (ldmatrix lane
    addresses into shared memory, rows [row][d]):

    ``scores(S, q_frag, q_lane, k_tile, smem, scratch, tid)``: S (MT, NT, 4) = Q_i K_j^T, Q_i
    at ``q_lane`` and K_j at ``k_tile``; q_frag (MT, 4) holds the A fragments of one k-step;
    ``accumulate(O_i, S, v_tile, smem, scratch, tid)``: O_i (MT, DT, 4) += P_ij V_j, P_ij the
    fragments of S rounded to 16 bits (the A operand) and V_j at ``v_tile`` through
    ``ldmatrix.trans``."""
    mma, pack = mma_sync.mma(FMT), convert.pack(FMT)
    ldsm_x4, ldsm_x4_t = mma_sync.ldmatrix_x4, mma_sync.ldmatrix_x4_trans
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def mma_pair(a, b0, b1, b2, b3, C, mt, t, scratch, tid):
        """C[mt, t] += a (b0, b1) and C[mt, t + 1] += a (b2, b3): the two 8-column tiles that
        one ldmatrix.x4 of the B operand feeds."""
        c0 = mma(a, (b0, b1), (C[mt, t, 0], C[mt, t, 1], C[mt, t, 2], C[mt, t, 3]), scratch, tid)
        c1 = mma(a, (b2, b3), (C[mt, t + 1, 0], C[mt, t + 1, 1], C[mt, t + 1, 2],
                               C[mt, t + 1, 3]), scratch, tid)
        for e in range(4):
            C[mt, t, e] = c0[e]
            C[mt, t + 1, e] = c1[e]

    @cuda.jit(device=True, inline="always")
    def scores(S, q_frag, q_lane, k_tile, smem, scratch, tid):
        # One ldmatrix.x4 of K gives two 8-column tiles, used by every m-tile.
        for mt in range(MT):
            for nt in range(NT):
                for e in range(4):
                    S[mt, nt, e] = ZERO
        # Unrolled (like every loop here), ptxas issues the next k-step's ldmatrix under
        # this one's mma.
        for ks in range(KSTEPS):
            for mt in range(MT):
                r0, r1, r2, r3 = ldsm_x4(smem, q_lane + 16 * mt * STRIDE + 16 * ks,
                                         scratch, tid)
                q_frag[mt, 0] = r0
                q_frag[mt, 1] = r1
                q_frag[mt, 2] = r2
                q_frag[mt, 3] = r3
            for np2 in range(NT // 2):
                k0, k1, k2, k3 = ldsm_x4(smem, k_tile + 16 * np2 * STRIDE + 16 * ks,
                                         scratch, tid)
                for mt in range(MT):
                    qa = (q_frag[mt, 0], q_frag[mt, 1], q_frag[mt, 2], q_frag[mt, 3])
                    mma_pair(qa, k0, k1, k2, k3, S, mt, 2 * np2, scratch, tid)

    @cuda.jit(device=True, inline="always")
    def accumulate(O_i, S, v_tile, smem, scratch, tid):
        # P straight from registers, each V fragment used by every m-tile.
        for kk in range(NT // 2):
            for dp in range(DT // 2):
                v0, v1, v2, v3 = ldsm_x4_t(smem, v_tile + 16 * kk * STRIDE + 16 * dp,
                                           scratch, tid)
                for mt in range(MT):
                    n_a, n_b = 2 * kk, 2 * kk + 1
                    pa = (pack(S[mt, n_a, 0], S[mt, n_a, 1]), pack(S[mt, n_a, 2], S[mt, n_a, 3]),
                          pack(S[mt, n_b, 0], S[mt, n_b, 1]), pack(S[mt, n_b, 2], S[mt, n_b, 3]))
                    mma_pair(pa, v0, v1, v2, v3, O_i, mt, 2 * dp, scratch, tid)

    return scores, accumulate


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, NWARPS, VARLEN=False,
                        PAGED=False, WINDOW=False, SOFTCAP=False, ALIBI=False, SINK=False):
    """Python kernel function for one configuration (``SPEC`` compiles it).
    Each of the NWARPS warps owns MT = BLOCK_M / (16 NWARPS) m16 tiles of query rows: with
    MT = 2 every K/V fragment loaded by ldmatrix feeds two mma instead of one."""
    assert FMT in ("float16", "bfloat16") and BLOCK_N % 16 == 0 and BLOCK_M % (16 * NWARPS) == 0
    MT = BLOCK_M // (16 * NWARPS)  # m16 tiles of query rows per warp
    THREADS = 32 * NWARPS
    DPAD = padded_head_dim(HEAD_DIM)
    STRIDE = DPAD + PAD
    KSTEPS = DPAD // 16          # k-steps of Q K^T
    NT = BLOCK_N // 8            # 8-column tiles of S
    DT = DPAD // 8               # 8-column tiles of O
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, PAGED)
    Q_OFF, K_OFF, V_OFF, O_OFF = lay.q, lay.k, lay.v, lay.o
    TILE = BLOCK_N * STRIDE      # elements of one K (or V) buffer
    SCRATCH = mma_sync.scratch_size(THREADS)  # words the emulated warp instructions exchange
    SHFL_SCRATCH = sync.scratch_size(THREADS)  # floats the emulated shuffles exchange
    pack = convert.pack(FMT)
    shfl_xor = sync.shfl_xor
    scores, accumulate = make_products(MT, NT, DT, KSTEPS, STRIDE, FMT)
    seqlen_info = make_seqlen_info(VARLEN, PAGED)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    softmax_step = make_softmax_step(MT, NT, DT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW, SOFTCAP,
                                     ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    sink_start = make_sink(False, SINK)
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW, PAGED)
    ZERO, ONE = float32(0.0), float32(1.0)

    ROW_CHUNKS = HEAD_DIM // 8                        # 16-byte chunks of an output row
    OUT_CHUNKS = 16 * MT * ROW_CHUNKS                 # ... of a warp's output rows
    ALIGN_MASK = uint64(15)
    # Q, K, V tiles global -> shared: each thread always copies the same 16-byte chunk column,
    # so only the row offset changes from copy to copy (common/copies.py).
    copy_slot, load_tile, load_paged_kv = make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS)
    paged_first, paged_next = make_paged_steps(load_paged_kv, THREADS, BLOCK_N)
    ROWS_OFF = lay.rows if PAGED else 0

    def flash_fwd_tc(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                     cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table, window_left,
                     window_right, softcap, alibi_slopes, sink):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        smem_words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        copy_r0, copy_c = copy_slot(tid)
        a_row, a_col = mma_sync.ldmatrix_a_rowcol(lane)
        b_row, b_col = mma_sync.ldmatrix_b_rowcol(lane)
        # Each lane's ldmatrix row address, up to a compile-time offset: one add per load.
        k_lane = K_OFF + b_row * STRIDE + b_col
        v_lane = V_OFF + a_row * STRIDE + a_col
        # Causal: the longest query tiles first (the grid's last CTAs are then the short ones).
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x) * BLOCK_M
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group

        keys = block_table.shape[1] * k.shape[1] if PAGED else k.shape[1]  # rows of K
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], keys, cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            if m0 >= seqlen_q:
                return  # a query tile past the sequence's end
            q, out, lse = q[:, q0:], out[:, q0:], lse[:, :, q0:]
            if not PAGED:  # paged keys are found through the table (load_paged_kv)
                k, v = k[:, k0:], v[:, k0:]
        # Sliding window: keys from the first tile (or page) it reaches, diagonals relative to it.
        k, v, block_table, seqlen_k, rel0, diag, diag_lo = key_view(
            k, v, block_table, m0, diag, seqlen_k, window_left, window_right)
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
        end = kv_end(m0, diag, seqlen_k)  # causal: the key tiles past the diagonal are skipped
        rows_w = ROWS_OFF >> 1  # paged: the row table, in 32-bit words
        entry = -1              # ... and the table entry this thread reads ahead
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0

        # Prologue: Q and the first K/V tile in flight together; Q is needed first.
        load_tile(smem, Q_OFF, q, b, m0, h, BLOCK_M, seqlen_q, copy_r0, copy_c)
        if n_tiles > 0:
            if PAGED:  # rows through the shared row table (common/copies.py)
                entry = paged_first(smem, smem_words, rows_w, K_OFF, V_OFF, k, v,
                                    block_table, b, hk, seqlen_k, copy_r0, copy_c, status)
            else:
                load_tile(smem, K_OFF, k, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
                load_tile(smem, V_OFF, v, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
        memory.cp_async_commit()
        memory.cp_async_wait(0)
        cuda.syncthreads()

        q_lane = Q_OFF + (16 * MT * warp + a_row) * STRIDE + a_col

        # Online-softmax state of this thread's rows: m-tile mt, half 0 (row g) or 1 (row g + 8).
        m_i = cuda.local.array((MT, 2), float32)
        l_i = cuda.local.array((MT, 2), float32)
        m_tile = cuda.local.array((MT, 2), float32)  # row maxima of the current S tile
        O_i = cuda.local.array((MT, DT, 4), float32)
        S = cuda.local.array((MT, NT, 4), float32)
        q_frag = cuda.local.array((MT, 4), uint32)  # A fragments of one k-step
        # A sink starts each row as a key seen (its sum on one lane of the quad).
        m_start, l_start = sink_start(sink, h, scale_log2)
        for mt in range(MT):
            for half in range(2):
                m_i[mt, half] = m_start
                l_i[mt, half] = l_start if t2 == 0 else ZERO
            for dt in range(DT):
                for e in range(4):
                    O_i[mt, dt, e] = ZERO
        row_g = m0 + 16 * MT * warp + g  # global query index of this thread's first row

        for j in range(n_tiles):
            n0 = j * BLOCK_N
            buf = (j & 1) * TILE
            memory.cp_async_wait(0)  # tile j, the only copy in flight, has landed ...
            cuda.syncthreads()     # ... for every thread, and every warp is done with tile j - 1,
            if j + 1 < n_tiles:    # so its buffer can take tile j + 1 while tile j is computed
                nxt = TILE - buf
                if PAGED:
                    entry = paged_next(smem, smem_words, rows_w, K_OFF + nxt, V_OFF + nxt,
                                       k, v, block_table, b, hk, j, seqlen_k, copy_r0, copy_c,
                                       entry, status)
                else:
                    load_tile(smem, K_OFF + nxt, k, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                              copy_r0, copy_c)
                    load_tile(smem, V_OFF + nxt, v, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                              copy_r0, copy_c)
                memory.cp_async_commit()
            k_tile = k_lane + buf
            v_tile = v_lane + buf

            # S_ij = Q_i K_j^T.
            scores(S, q_frag, q_lane, k_tile, smem, scratch, tid)

            # Mask (only tiles that cross the ragged end or the causal diagonal), then the online
            # softmax: S becomes P, m_i / l_i / O_i move (make_softmax_step).
            softmax_step(S, m_i, l_i, O_i, m_tile, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                         scale_log2, mods, shfl_scratch, tid)

            # O_i += P_ij V_j: P straight from registers as the A operand, V through
            # ldmatrix.trans.
            accumulate(O_i, S, v_tile, smem, scratch, tid)

        # Epilogue: full row sums over the quad, O_i / l_i and lse_i (natural log). The output
        # goes through the Q tile's shared memory (each warp its own 16 MT rows): a thread's two
        # C-fragment columns are one packed 32-bit store there, and the global stores are then
        # whole 16-byte chunks of rows (one instruction writes 512 contiguous-by-row bytes,
        # where straight from the fragments it would write 8 bytes to each of 8 rows).
        # Addresses are formed once and advanced by constants: unsigned shared indices skip
        # Numba's negative-index fix-up, and global ones are byte addresses (global_address),
        # which took this epilogue from ~4.4 to ~1.8 us of a ~51 us block (D = 128, N = 1024).
        cuda.syncthreads()  # every ldmatrix of Q is behind us
        # All rows' sums first: their quad shuffles are independent, so their latencies overlap.
        for mask in (1, 2):
            for mt in range(MT):
                for half in range(2):
                    l_i[mt, half] += shfl_xor(l_i[mt, half], mask, shfl_scratch, tid)
        w_row = O_OFF + 16 * MT * warp * STRIDE
        o_word0 = uint32((w_row + g * STRIDE + t2) >> 1)  # all even
        for mt in range(MT):
            for half in range(2):
                l = l_i[mt, half]
                inv = ONE / l if l > ZERO else ZERO
                o_word = o_word0 + ((16 * mt + 8 * half) * STRIDE >> 1)
                for dt in range(DT):
                    smem_words[o_word + 4 * dt] = pack(O_i[mt, dt, 2 * half] * inv,
                                                       O_i[mt, dt, 2 * half + 1] * inv)
        if t2 == 0:
            for mt in range(MT):
                for half in range(2):
                    l = l_i[mt, half]
                    row = row_g + 16 * mt + 8 * half
                    if row < seqlen_q:
                        lse[b, h, row] = lse_of(m_i[mt, half] * scale_log2, l)
        cuda.syncthreads()  # a warp reads only its own rows; the simulator has no syncwarp
        w_row0 = m0 + 16 * MT * warp  # global row of the warp's first output row
        out_w = memory.global_address(out, (b, w_row0, h, 0))
        row_bytes = uint64(out.strides[1])
        aligned = (out_w | row_bytes) & ALIGN_MASK == 0  # else an out= view of odd alignment
        if aligned and w_row0 + 16 * MT <= seqlen_q:
            # The common case, without a test per chunk: straight-line code in which ptxas
            # issues the shared loads ahead of the global stores that wait on them.
            for step in range((OUT_CHUNKS + 31) // 32):
                i = lane + 32 * step  # chunk i of the warp's rows: row i // ROW_CHUNKS
                if OUT_CHUNKS % 32 == 0 or i < OUT_CHUNKS:
                    r = i // ROW_CHUNKS
                    c = i - r * ROW_CHUNKS
                    memory.st_global_16(out_w + uint64(r) * row_bytes + uint64(16 * c), smem,
                                     w_row + r * STRIDE + 8 * c)
        else:  # a ragged last query tile, or an out= view of odd alignment
            for step in range((OUT_CHUNKS + 31) // 32):
                i = lane + 32 * step
                if OUT_CHUNKS % 32 == 0 or i < OUT_CHUNKS:
                    r = i // ROW_CHUNKS
                    c = i - r * ROW_CHUNKS
                    if w_row0 + r < seqlen_q:
                        store_chunk(out_w + uint64(r) * row_bytes + uint64(16 * c), smem,
                                    w_row + r * STRIDE + 8 * c, aligned)

    return flash_fwd_tc


# ----------------------------------------------------------------------------- spec

# (BLOCK_M, BLOCK_N, warps, register cap) by head dim, best first, from the tile sweep
# bench/tune_tc_forward.py on an H200 (bench/results/NVIDIA-H200/: tune_tc_forward.csv
# for the warp counts, tune_tc_forward_d69e4f6.csv for 64 against 32 keys at D = 128); every
# entry compiles without spills for sm_80 and sm_90 (the PTX test checks both). 4 warps of 32 query rows each (MT = 2), up to 255
# registers: every K and V fragment from ldmatrix feeds two mma, and the per-tile costs (barrier,
# copies, row reductions) are shared by twice the work; 8-warp blocks of 16 rows under a
# 128-register cap ran 8-18% slower (D = 64: 272 vs 294 TFLOP/s, D = 128: 273 vs 323,
# non-causal, N = 4096). A head dim takes the first entry of which two blocks fit in one SM's
# shared memory (two blocks per SM is what the registers allow; one block of 4 warps cannot keep
# the tensor cores busy). At D = 128, 64 keys (102 KiB) need a Hopper's 228 KiB per SM (310 /
# 332 / 333 TFLOP/s non-causal at N = 1k / 4k / 16k against 308 / 325 / 330 with 32 keys); an
# A100 (164 KiB) or an sm_86/89 part takes 32 keys (68 KiB).
TILES = ((64, ((128, 64, 4, 0),)), (128, ((128, 64, 4, 0), (128, 32, 4, 0))),
         (256, ((64, 32, 4, 0),)))
# A varlen CTA computes its sequence's bounds (seqlen_q, seqlen_k, diag, its rows' offsets),
# which a dense one reads from its parameters: those few registers more spill the MT = 2 tiles
# (about 250 bytes at D = 128 on sm_80), so packed sequences take one m16 tile per warp. At
# D = 256 that still spills (about 190 bytes on sm_80): the varlen A100 path's open cost.
VARLEN_TILES = ((128, ((64, 64, 4, 0),)), (256, ((64, 32, 4, 0),)))


class Spec(ForwardSpec):
    name = "flash_fwd_tc"
    unroll_loops = True

    def entry(self, config, device):
        table = VARLEN_TILES if config.varlen else TILES
        options = next(t for limit, t in table if config.head_dim <= limit)
        per_sm = device.shared_per_sm if device is not None else None
        fits = [t for t in options if per_sm is None
                or 2 * (self.tiles(config, t).shared_bytes + SHARED_RESERVED_PER_BLOCK) <= per_sm]
        return (fits or options[-1:])[0]

    def tiles(self, config, entry):
        bm, bn, warps, regs = entry
        return Tiles(bm, bn, 32 * warps,
                     shared_layout(bm, bn, config.head_dim, config.paged).bytes, regs)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                   config.fmt, tiles.threads // 32, config.varlen,
                                   config.paged, config.window, config.softcap, config.alibi,
                                   config.sink)

    def samples(self):
        """A 32 x 16 tile of two warps at head dim 16 and every entry of the table at the largest
        head dim it serves, causal or not, in both formats; head dim 8 with the table's entry;
        varlen at head dim 128, with and without paged K/V; a sliding window, dense at head dim
        128 and varlen at 64; a softcap at 128; ALiBi with a sink at 128 (for sm_80); a paged
        window at 64."""
        entries = [(16, (32, 16, 2, 0))] + [(d, t) for d, options in TILES for t in options]
        return [sample("tc mma fwd", (d, causal, fmt), entry) for d, entry in entries
                for causal in (False, True) for fmt in HALF_FORMATS] + [
                    sample("tc mma fwd", (8, True, "float16")),
                    sample("tc mma fwd", (128, True, "bfloat16", True)),
                    sample("tc mma fwd", (128, True, "bfloat16", True, True)),
                    sample("tc mma fwd", (128, True, "float16", False, False, True)),
                    sample("tc mma fwd", (64, True, "bfloat16", True, False, True)),
                    sample("tc mma fwd", (128, False, "bfloat16", False, False, False, True)),
                    # (sm_80 only: sm_90 runs forward_wgmma.py, and there ptxas spills 8 bytes
                    # of this one at its 255 registers; ALiBi or a sink alone do not)
                    sample("tc mma fwd", (128, True, "float16", False, False, False, False, True,
                                          True), ccs=(SM80,)),
                    sample("tc mma fwd", (64, True, "bfloat16", True, True, True))]


SPEC = Spec()
