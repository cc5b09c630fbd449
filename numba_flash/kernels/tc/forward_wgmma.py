"""FlashAttention forward on Hopper's warpgroup tensor cores: ``wgmma.mma_async`` from pure Python.

What it computes
    The same function as ``forward_mma.py`` (the ``mma.sync`` kernel; read it first: the online
    softmax with lazy rescaling, the causal rules and the epilogue are the same), with both
    products issued as ``wgmma`` (ptx/wgmma.py): a warpgroup of 4 warps multiplies its 64 query rows
    by a whole K or V tile in one chain of asynchronous instructions that read the tiles straight
    from shared memory, where ``mma.sync`` made each warp load every K/V fragment into its own
    registers first. On an H200 that is the difference between ~2/3 of the tensor cores' rate
    and nearly all of it.

Grid / block mapping
    grid = (ceil(Sq / BLOCK_M), B * Hq), causal query tiles numbered from the last; block = NWG
    warpgroups (128 threads each), BLOCK_M = 64 NWG. Warpgroup ``wg`` owns query rows ``64 wg ..
    64 wg + 63`` of the tile; warp ``w`` (of the block) the 16 rows from ``16 w``, with the
    C-fragment ownership of ``forward_mma.py`` (lane: rows ``g`` and ``g + 8``, columns ``2 t, 2 t
    + 1`` of every 8-column tile). Per thread, in registers:

        S / P     BLOCK_N / 2 floats       this thread's part of S_ij = Q_i K_j^T (64 x BLOCK_N)
        O_i       DPAD / 2 floats          ... of O_i (64 x DPAD)
        m_i, l_i  2 + 2 floats             its two rows

    S_ij: KSTEPS = DPAD / 16 wgmma m64nBLOCK_Nk16, A = Q from shared memory, B = K^T (the K tile
    read K-major). O_i += P V: BLOCK_N / 16 wgmma m64nDPADk16 with P from registers (the S
    accumulator rounded to 16 bits and packed is the A fragment) and B = V (read MN-major).

Memory pipeline
    K/V tiles go global -> shared with ``cp.async`` (16 bytes per instruction), double buffered,
    one barrier per tile: tile j + 1 is in flight while tile j is computed. wgmma reads shared
    memory through the "async proxy", so every tile is published by wait -> proxy fence ->
    barrier (kernels/ptx/wgmma.py, "Ordering").

Shared memory (16-bit elements; every tile in kernels/ptx/wgmma.py's 128-byte-swizzle layout:
column blocks of 64 elements, no padding, bank-conflict free for cp.async writes, wgmma reads
and the epilogue)
    Q   BLOCK_M x DPAD          staged once; at the end it stages O
    K   2 x BLOCK_N x DPAD      double buffer
    V   2 x BLOCK_N x DPAD      double buffer
    + 1 KiB to put the tiles on a 1024-byte boundary. DPAD is HEAD_DIM rounded up to 64.
    e.g. HEAD_DIM 128, BLOCK_M 128, BLOCK_N 128: 32 + 2 x 2 x 32 + 1 = 161 KiB, one block per SM.

Limits
    float16 / bfloat16; HEAD_DIM a multiple of 8 up to 256 (DPAD / 2 + BLOCK_N / 2 accumulator
    registers per thread bound the tiles); any Sq, Sk; compute capability 9.0 (sm_90a: wgmma
    exists on Hopper only; the tc backend runs ``forward_mma.py`` elsewhere).
    Dense batches, or packed varlen sequences (``VARLEN``): each CTA takes its sequence's
    rows from ``common/masks.make_seqlen_info`` and returns when its tile lies past the
    sequence's end (kernels/attention.py). Paged K/V, the sliding window, softcap, ALiBi and the
    sink (``PAGED``, ``WINDOW``, ``SOFTCAP``, ``ALIBI``, ``SINK``): as in ``forward_mma.py``,
    through the same pieces (the step is ``common/softmax.make_softmax_step``), compile-time
    options that cost nothing when off.
"""

from functools import lru_cache

from numba import cuda, float32, int32, uint16, uint32, uint64

from ...runtime.spec import SM90A, Tiles
from ..attention import HALF_FORMATS, ForwardSpec, sample
from ..instructions import convert, memory, sync, wgmma
from ..common.copies import ROW_WORDS, make_paged_steps, make_swizzled_copy
from ..common.epilogue import lse_of, make_row_writer
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import make_key_view, make_kv_end, make_seqlen_info
from ..common.score_mods import make_score_mods, make_sink
from ..common.softmax import make_softmax_step

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only

WARPGROUP = wgmma.WARPGROUP


def padded_head_dim(head_dim):
    return wgmma.padded_cols(head_dim)


def shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, PAGED=False):
    """Q and the K, V double buffers, in 16-bit elements from the aligned base, with the
    alignment reserve (the module's "Shared memory"); the epilogue stages O over Q. Paged K/V
    adds the row table (two buffers of BLOCK_N rows of ROW_WORDS 32-bit words)."""
    dpad = padded_head_dim(HEAD_DIM)
    rows = [("rows", 2 * BLOCK_N * ROW_WORDS * 2)] if PAGED else []
    return SharedLayout(2, [("q", BLOCK_M * dpad), ("k", 2 * BLOCK_N * dpad),
                            ("v", 2 * BLOCK_N * dpad), *rows, ("o", BLOCK_M * dpad, "q")],
                        reserve=wgmma.TILE_ALIGN)


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False, PAGED=False,
                        WINDOW=False, SOFTCAP=False, ALIBI=False, SINK=False):
    """Python kernel function for one configuration (``SPEC`` compiles it, for
    sm_90a)."""
    assert FMT in ("float16", "bfloat16") and BLOCK_M % 64 == 0 and BLOCK_N % 16 == 0
    THREADS = BLOCK_M // 64 * WARPGROUP
    DPAD = padded_head_dim(HEAD_DIM)
    KSTEPS = DPAD // 16          # k-steps of Q K^T
    NT = BLOCK_N // 8            # 8-column tiles of S
    DT = DPAD // 8               # 8-column tiles of O
    S_REGS, O_REGS = 4 * NT, 4 * DT  # accumulator registers per thread (constants for fences)
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, PAGED)
    Q_OFF, K_OFF, V_OFF, O_OFF = lay.q, lay.k, lay.v, lay.o
    TILE = BLOCK_N * DPAD        # elements of one K (or V) buffer
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(FMT, BLOCK_N, 0)   # S = Q K^T, K read K-major
    mma_o = wgmma.mma_rs(FMT, DPAD, 1)      # O += P V, V read MN-major
    pack = convert.pack(FMT)
    shfl_xor = sync.shfl_xor
    seqlen_info = make_seqlen_info(VARLEN, PAGED)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    softmax_step = make_softmax_step(1, NT, DT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW, SOFTCAP,
                                     ALIBI)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    sink_start = make_sink(False, SINK)
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW, PAGED)
    ZERO, ONE = float32(0.0), float32(1.0)

    # Descriptor arithmetic, in 16-byte units (kernels/ptx/wgmma.py, "Shared-memory operands";
    # wgmma.k_step for K-major k-steps): V's 64-column blocks are BLOCK_N rows of 128 bytes
    # apart, a buffer is TILE elements.
    SBO, V_STEP, k_step = wgmma.SBO, wgmma.MN_K_STEP, wgmma.k_step
    V_LBO = BLOCK_N * wgmma.SWIZZLE_BYTES
    BUF_STEP = TILE * 2 // 16

    write_rows = make_row_writer(HEAD_DIM, BLOCK_M)
    copy_slot, load_tile, load_paged_kv = make_swizzled_copy(HEAD_DIM, DPAD, THREADS)
    paged_first, paged_next = make_paged_steps(load_paged_kv, THREADS, BLOCK_N)
    ROWS_OFF = lay.rows if PAGED else 0

    def flash_fwd_wgmma(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                        cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table,
                        window_left, window_right, softcap, alibi_slopes, sink):
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
        base = wgmma.aligned_base(smem)  # the tiles start on a 1024-byte boundary
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x) * BLOCK_M
        b = int32(convert.div_u32(bh, n_heads_q))  # 32-bit: no division subroutine
        h = bh - b * n_heads_q
        hk = int32(convert.div_u32(h, group))

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
        rows_w = (base + ROWS_OFF) >> 1  # paged: the row table, in 32-bit words
        entry = -1                          # ... and the table entry this thread reads ahead
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0

        # Prologue: Q and the first K/V tile in flight together.
        load_tile(smem, base + Q_OFF, q, b, m0, h, BLOCK_M, seqlen_q, copy_r0, copy_c)
        if n_tiles > 0:
            if PAGED:  # rows through the shared row table (common/copies.py)
                entry = paged_first(smem, smem_words, rows_w, base + K_OFF, base + V_OFF, k, v,
                                    block_table, b, hk, seqlen_k, copy_r0, copy_c, status)
            else:
                load_tile(smem, base + K_OFF, k, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
                load_tile(smem, base + V_OFF, v, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
        memory.cp_async_commit()

        # Descriptors of this warpgroup's Q rows and of the first K and V buffers.
        desc_q = wgmma.descriptor(smem, base + Q_OFF + (tid >> 7) * 64 * wgmma.BLOCK_COLS, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO)
        desc_v = wgmma.descriptor(smem, base + V_OFF, V_LBO, SBO)

        # The shapes of forward_mma.py with one m16 tile per warp (MT = 1).
        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        m_tile = cuda.local.array((1, 2), float32)  # row maxima of the current S tile
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)
        m_start, l_start = sink_start(sink, h, scale_log2)  # a sink: a key already seen
        for half in range(2):
            m_i[0, half] = m_start
            l_i[0, half] = l_start if t2 == 0 else ZERO
        for dt in range(DT):
            for e in range(4):
                O_i[0, dt, e] = ZERO
        row_g = m0 + 16 * warp + g  # global query index of this thread's first row

        for j in range(n_tiles):
            n0 = j * BLOCK_N
            memory.cp_async_wait(0)  # tile j has landed (for this thread's copies) ...
            sync.proxy_fence()       # ... is visible to wgmma reads ...
            cuda.syncthreads()       # ... for every thread; every warpgroup is done with tile j - 1
            if j + 1 < n_tiles:
                nxt = TILE - (j & 1) * TILE
                if PAGED:
                    entry = paged_next(smem, smem_words, rows_w, base + K_OFF + nxt,
                                       base + V_OFF + nxt, k, v, block_table, b, hk, j, seqlen_k,
                                       copy_r0, copy_c, entry, status)
                else:
                    load_tile(smem, base + K_OFF + nxt, k, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                              copy_r0, copy_c)
                    load_tile(smem, base + V_OFF + nxt, v, b, n0 + BLOCK_N, hk, BLOCK_N, seqlen_k,
                              copy_r0, copy_c)
                memory.cp_async_commit()
            buf = uint64((j & 1) * BUF_STEP)

            # S_ij = Q_i K_j^T: one chain of KSTEPS wgmma, the first overwriting S.
            wgmma.fence()
            for ks in range(KSTEPS):
                mma_s(S, 0, desc_q + k_step(ks, BLOCK_M), desc_k + buf + k_step(ks, BLOCK_N),
                      ks > 0, smem, scratch, tid)
            wgmma.commit()
            wgmma.wait(0)
            wgmma.fence_operands(S, S_REGS)

            # Mask and online softmax, as in forward_mma.py (one m16 tile of rows per warp).
            softmax_step(S, m_i, l_i, O_i, m_tile, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                         scale_log2, mods, shfl_scratch, tid)

            # O_i += P_ij V_j: P from registers, 16 keys per wgmma.
            wgmma.fence()
            for kk in range(NT // 2):
                pa = (pack(S[0, 2 * kk, 0], S[0, 2 * kk, 1]), pack(S[0, 2 * kk, 2], S[0, 2 * kk, 3]),
                      pack(S[0, 2 * kk + 1, 0], S[0, 2 * kk + 1, 1]),
                      pack(S[0, 2 * kk + 1, 2], S[0, 2 * kk + 1, 3]))
                mma_o(O_i, 0, pa, desc_v + buf + uint64(kk * V_STEP), 1, smem, scratch, tid)
            wgmma.commit()
            wgmma.wait(0)
            wgmma.fence_operands(O_i, O_REGS)

        # Epilogue, as in forward_mma.py: O_i / l_i staged through the Q tile (its swizzle makes
        # both the fragment writes and the 16-byte row reads conflict-free), lse_i.
        memory.cp_async_wait(0)  # Q's copy, where no key tile waited for it (causal, Sq > Sk)
        cuda.syncthreads()    # every warpgroup's wgmma reads of Q are behind us
        for mask in (1, 2):
            for half in range(2):
                l_i[0, half] += shfl_xor(l_i[0, half], mask, shfl_scratch, tid)
        for half in range(2):
            l = l_i[0, half]
            inv = ONE / l if l > ZERO else ZERO
            row = 16 * warp + g + 8 * half
            for dt in range(DT):
                word = uint32(base + O_OFF + wgmma.tile_offset(row, 8 * dt + t2, BLOCK_M)) >> 1
                smem_words[word] = pack(O_i[0, dt, 2 * half] * inv, O_i[0, dt, 2 * half + 1] * inv)
        if t2 == 0:
            for half in range(2):
                l = l_i[0, half]
                row = row_g + 8 * half
                if row < seqlen_q:
                    lse[b, h, row] = lse_of(m_i[0, half] * scale_log2, l)
        cuda.syncthreads()  # a warp reads only its own rows; the simulator has no syncwarp
        write_rows(out, b, m0 + 16 * warp, h, seqlen_q, smem, base + O_OFF, 16 * warp, lane)

    return flash_fwd_wgmma


# ----------------------------------------------------------------------------- spec

# (BLOCK_M, BLOCK_N, warps, register cap) by head dim, non-causal and causal: BLOCK_M = 64 per
# warpgroup, warps = BLOCK_M / 16. Measured by bench/tune_tc_forward.py --family wgmma on an H200
# (bench/results/NVIDIA-H200/: tune_tc_wgmma.csv for D = 128, runs r1 and r3 of
# tune_tc_wgmma_1867622.csv for D = 64; TFLOP/s fp16 at N = 1k / 4k / 16k):
#   D = 128: 128 x 128 (161 KiB, one block per SM): 392 / 428 / 437 non-causal, 313 / 398 / 443
#            causal; 192 x 64 and 128 x 64 were 3-20% slower;
#   D = 64:  128 x 64 (49 KiB, 98 registers: two blocks per SM): 357 / 389 / 400 non-causal,
#            276 / 358 / 391 causal, against 128 x 128 at 321 / 363 / 372 and 235 / 316 / 349.
#            ptxas' schedule is sensitive to the kernel's branch layout: re-sweep after changing
#            the kernel;
#   D = 256: 64 x 64 (248 registers), correct on the GPU tests, not swept.
TILES = ((64, ((128, 64, 8, 0), (128, 64, 8, 0))),
         (128, ((128, 128, 8, 0), (128, 128, 8, 0))),
         (256, ((64, 64, 4, 0), (64, 64, 4, 0))))


class Spec(ForwardSpec):
    name = "flash_fwd_wgmma"
    unroll_loops = True

    def entry(self, config, device):
        return next(t for limit, t in TILES if config.head_dim <= limit)[int(config.causal)]

    def tiles(self, config, entry):
        bm, bn, warps, regs = entry
        return Tiles(bm, bn, 32 * warps,
                     shared_layout(bm, bn, config.head_dim, config.paged).bytes, regs)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                   config.fmt, config.varlen, config.paged, config.window,
                                   config.softcap, config.alibi, config.sink)

    def samples(self):
        """Every entry of the table at the largest head dim it serves and three warpgroups of 64
        rows at head dim 8, causal or not, in both formats; varlen at head dim 128,
        with and without paged K/V; a sliding window, dense at head dim 128 and varlen at 64;
        a softcap at 128; ALiBi with a sink at 128; a paged window at 64."""
        rows = TILES + ((8, ((192, 32, 12, 0),) * 2),)
        return [sample("tc wgmma fwd", (d, causal, fmt), entries[int(causal)], ccs=(SM90A,))
                for d, entries in rows for causal in (False, True) for fmt in HALF_FORMATS] + [
                    sample("tc wgmma fwd", (128, True, "bfloat16", True), ccs=(SM90A,)),
                    sample("tc wgmma fwd", (128, True, "bfloat16", True, True), ccs=(SM90A,)),
                    sample("tc wgmma fwd", (128, True, "float16", False, False, True),
                           ccs=(SM90A,)),
                    sample("tc wgmma fwd", (64, True, "bfloat16", True, False, True),
                           ccs=(SM90A,)),
                    sample("tc wgmma fwd", (128, False, "bfloat16", False, False, False, True),
                           ccs=(SM90A,)),
                    sample("tc wgmma fwd", (128, True, "float16", False, False, False, False,
                                            True, True), ccs=(SM90A,)),
                    sample("tc wgmma fwd", (64, True, "bfloat16", True, True, True),
                           ccs=(SM90A,))]


SPEC = Spec()
