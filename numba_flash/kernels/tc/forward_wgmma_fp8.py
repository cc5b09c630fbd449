"""FlashAttention-3's FP8 forward: e4m3 Q, K, V on Hopper's warpgroup tensor cores.

What it computes
    The function of ``forward_wgmma.py`` (read it first: the loop, the online softmax and the
    epilogue are the same) on float8_e4m3fn inputs with FA3's per-(batch, kv head) descales:
    ``q = q8 * q_descale[b, hk]`` and likewise k and v. Both products run as ``wgmma ... k32
    .e4m3.e4m3`` (kernels/ptx/wgmma.py, "8-bit operands"), twice the 16-bit rate:

        S_ij = Q8_i K8_j^T                       raw scores; q_descale k_descale ride in the
                                                 softmax scale (scale_log2 below)
        P_ij = exp2(S_ij scale_log2 - m_i ...)   float32, as in the 16-bit kernel; l_i sums it
        O_i += e4m3(P_ij) V8_j                   P rounded to e4m3 (nearest even) for the
                                                 product, as FA3 does
        out  = O_i v_descale / l_i               in bfloat16 (or float16)

    m_i follows every new row maximum (no lazy rescale: common/softmax.py's RESCALE_AT = 0), so
    P lies in [0, 1] and the row's largest P is exactly 1; the others round by a relative 2^-4,
    and values below 2^-9 of the row's running maximum flush to zero. l_i sums the unrounded P,
    so the rounding errors of a row average out instead of biasing its normalisation.

Two layout problems, and what solves them
    1. An 8-bit wgmma reads B K-major only: for ``P V`` that is V^T, d rows of keys. The K/V tiles
       arrive as rows of keys (cp.async, as in the 16-bit kernel), and the threads transpose V in
       shared memory (``make_v_transpose``), 4 x 4 bytes at a time with shifts and masks, while
       the tensor cores run the tile's ``Q K^T`` (issued just before, asynchronously).
    2. The 8-bit A fragment of a thread is four consecutive k of a row (``4 t .. 4 t + 3``), but
       the accumulator of ``Q K^T`` gives the thread columns ``2 t, 2 t + 1`` of each 8-column
       tile. Rather than exchange registers between lanes, the kernel renames the keys: within
       each 32 keys, k-position ``p = 16 h + 4 t + 2 i + e`` (h, i, e in {0, 1}, t < 4) holds key
       ``8 (2 h + i) + 2 t + e``. A sum over k does not care about the order of its terms, so
       ``P V`` is unchanged if V^T's columns follow the same renaming; the transpose writes them
       so, and each A register is just four of the thread's own P values packed
       (``convert.pack_e4m3x4``).

Grid / block mapping
    As ``forward_wgmma.py``: grid = (ceil(Sq / BLOCK_M), B * Hq), causal tiles from the last;
    NWG warpgroups of 64 query rows each. A key tile is BLOCK_N = 128 keys (a V^T row is then one
    128-byte swizzle row); it is consumed in steps of SUB_N keys (128, or 64 at head dim 256 to
    hold S and O_i in registers): per step one ``Q K^T`` chain, the softmax and one ``P V``
    chain.

Shared memory (16-bit units; Q, K and V hold two e4m3 per unit; every tile 128-byte swizzled)
    Q    BLOCK_M x DB bytes          staged once; DB = HEAD_DIM rounded up to 128
    K    2 x BLOCK_N x DB bytes      double buffer (cp.async)
    V    2 x BLOCK_N x DB bytes      double buffer, rows of keys as they arrive
    VT   DB x BLOCK_N bytes          V^T of the current tile, keys renamed
    O    BLOCK_M x padded HEAD_DIM 16-bit   the epilogue's staging, over Q and K
    + 1 KiB alignment. e.g. HEAD_DIM 128, BLOCK_M 128: 16 + 32 + 32 + 16 + 1 = 97 KiB.

Per key tile: barrier (K_j, V_j landed; every warpgroup done with tile j - 1 and VT), copies of
tile j + 1 issued, ``Q K^T`` issued, V_j transposed into VT, proxy fence + barrier, then the
softmax and ``P V``: two barriers a tile where the 16-bit kernel has one.

Limits
    sm_90a; HEAD_DIM a multiple of 16 up to 256 (rows in whole 16-byte chunks; 64 is padded to
    128 bytes, half of its products wasted); any Sq, Sk; dense or varlen batches, GQA, causal,
    the sliding window, softcap, ALiBi and the sink through the shared pieces; no paged K/V.
    Forward only (FA3's FP8 has no backward either).
"""

from functools import lru_cache

from numba import cuda, float32, int32, uint16, uint32, uint64

from ...runtime.spec import SM90A, Tiles
from ..attention import AttentionConfig, ForwardSpec, sample
from ..instructions import convert, memory, sync, wgmma
from ..common.copies import make_swizzled_copy
from ..common.epilogue import lse_of, make_row_writer
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import make_key_view, make_kv_end, make_seqlen_info
from ..common.score_mods import make_score_mods, make_sink
from ..common.softmax import make_softmax_step

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only

WARPGROUP = wgmma.WARPGROUP
E4M3 = wgmma.E4M3
BLOCK_N = 128        # keys per tile: one 128-byte row of V^T
MAX_HEAD_DIM = 256
FP8_FORMAT = "float8_e4m3fn"
OUT_FORMATS = ("bfloat16", "float16")


def row_bytes(head_dim):
    """DB: bytes of a Q, K or V row in shared memory, whole 128-byte swizzle rows."""
    return -(-head_dim // wgmma.SWIZZLE_BYTES) * wgmma.SWIZZLE_BYTES


def shared_layout(BLOCK_M, HEAD_DIM):
    """The module's "Shared memory", in 16-bit units from the aligned base."""
    words = row_bytes(HEAD_DIM) // 2  # 16-bit units of an 8-bit row
    return SharedLayout(2, [("q", BLOCK_M * words), ("k", 2 * BLOCK_N * words),
                            ("v", 2 * BLOCK_N * words), ("vt", BLOCK_N // 2 * row_bytes(HEAD_DIM)),
                            ("o", BLOCK_M * wgmma.padded_cols(HEAD_DIM), "q")],
                        reserve=wgmma.TILE_ALIGN)


def make_v_transpose(DB, THREADS):
    """``transpose(smem_words, v_at, vt_at, tid)``: V^T of the key tile staged at 16-bit unit
    ``v_at`` (BLOCK_N rows of DB bytes) into the tile at ``vt_at`` (DB rows of BLOCK_N bytes),
    the keys of each 32 renamed as the module's docstring says.

    A work unit is 4 keys x 4 bytes of d: the words of keys ``k0, k0 + 1, k0 + 8, k0 + 9`` (k0
    = 32 c + 16 h + 2 t) at d-word ``dw`` become d rows ``4 dw .. 4 dw + 3`` of one V^T word at
    byte ``32 c + 16 h + 4 t``. Lane (t = lane & 3, u = lane >> 2) takes key group (c, h) = u
    and d chunk ``u ^ delta``, word ``(t + s) & 3`` of it, where step (delta, s) is the same for
    the whole warp: both the four reads (one row each) and the four writes (one V^T row each)
    of a warp then fall in 32 different banks under the swizzle."""
    D_BLOCKS = DB // wgmma.SWIZZLE_BYTES
    STEPS = 32 * D_BLOCKS                # (delta, s, d block) combinations
    WARPS = THREADS // 32
    tile_offset = wgmma.tile_offset
    LO, HI = uint32(0x00FF00FF), uint32(0xFF00FF00)
    LOW, HIGH = uint32(0xFFFF), uint32(0xFFFF0000)

    @cuda.jit(device=True, inline="always")
    def transpose(words, v_at, vt_at, tid):
        lane = tid & 31
        t = lane & 3
        u = lane >> 2
        k0 = 16 * u + 2 * t  # 32 c + 16 h + 2 t with (c, h) = (u >> 1, u & 1)
        for step in range(tid >> 5, STEPS, WARPS):
            delta = step & 7
            dw = 32 * (step >> 5) + 4 * (u ^ delta) + ((t + (step >> 3)) & 3)  # d-word
            a = words[(v_at + tile_offset(k0, 2 * dw, BLOCK_N)) >> 1]
            b = words[(v_at + tile_offset(k0 + 1, 2 * dw, BLOCK_N)) >> 1]
            c = words[(v_at + tile_offset(k0 + 8, 2 * dw, BLOCK_N)) >> 1]
            e = words[(v_at + tile_offset(k0 + 9, 2 * dw, BLOCK_N)) >> 1]
            # Bytes i of a, b, c, e -> word i (byte 0 = key k0): interleave pairs, then halves.
            ab02 = (a & LO) | ((b & LO) << 8)     # a0 b0 a2 b2
            ab13 = ((a >> 8) & LO) | (b & HI)     # a1 b1 a3 b3
            ce02 = (c & LO) | ((e & LO) << 8)
            ce13 = ((c >> 8) & LO) | (e & HI)
            col = 8 * u + 2 * t  # byte 32 c + 16 h + 4 t, in 16-bit units
            row = 4 * dw
            words[(vt_at + tile_offset(row, col, DB)) >> 1] = (ab02 & LOW) | (ce02 << 16)
            words[(vt_at + tile_offset(row + 1, col, DB)) >> 1] = (ab13 & LOW) | (ce13 << 16)
            words[(vt_at + tile_offset(row + 2, col, DB)) >> 1] = (ab02 >> 16) | (ce02 & HIGH)
            words[(vt_at + tile_offset(row + 3, col, DB)) >> 1] = (ab13 >> 16) | (ce13 & HIGH)

    return transpose


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_M, SUB_N, CAUSAL, OUT_FMT, VARLEN=False, WINDOW=False,
                        SOFTCAP=False, ALIBI=False, SINK=False):
    """Python kernel function for one configuration (``SPEC`` compiles it, for sm_90a)."""
    assert OUT_FMT in OUT_FORMATS and BLOCK_M % 64 == 0 and BLOCK_N % SUB_N == 0
    assert HEAD_DIM % 16 == 0 and HEAD_DIM <= MAX_HEAD_DIM
    THREADS = BLOCK_M // 64 * WARPGROUP
    DB = row_bytes(HEAD_DIM)     # bytes of an 8-bit row: the k extent of Q K^T, n of P V
    KSTEPS = DB // 32            # k32 steps of Q K^T
    SUBS = BLOCK_N // SUB_N      # softmax steps per key tile
    PV_STEPS = SUB_N // 32       # k32 steps of P V per softmax step
    NT = SUB_N // 8              # 8-column tiles of S
    DT = DB // 8                 # 8-column tiles of O_i (DB columns: V^T has DB rows)
    DT_OUT = wgmma.padded_cols(HEAD_DIM) // 8  # ... of the staged output
    S_REGS, O_REGS = 4 * NT, 4 * DT
    lay = shared_layout(BLOCK_M, HEAD_DIM)
    Q_OFF, K_OFF, V_OFF, VT_OFF, O_OFF = lay.q, lay.k, lay.v, lay.vt, lay.o
    TILE = BLOCK_N * DB // 2     # 16-bit units of one K (or V) buffer
    SCRATCH = wgmma.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    mma_s = wgmma.mma_ss(E4M3, SUB_N, 0)   # S = Q K^T, K read K-major
    mma_o = wgmma.mma_rs(E4M3, DB, 0)      # O += P V, V^T read K-major
    pack4 = convert.pack_e4m3x4
    pack_out = convert.pack(OUT_FMT)
    shfl_xor = sync.shfl_xor
    seqlen_info = make_seqlen_info(VARLEN, False)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    # Eager rescaling (m_i follows every new row maximum): P <= 1, and the largest P of a row,
    # which weighs most in its output, is 1 exactly in e4m3, as in FA3 (a stale m_i would round
    # it by up to 2^-4).
    softmax_step = make_softmax_step(1, NT, DT, SUB_N, CAUSAL, BLOCK_M, WINDOW, SOFTCAP, ALIBI,
                                     RESCALE_AT=0.0)
    score_factors = make_score_mods(False, SOFTCAP, ALIBI)[0]
    sink_start = make_sink(False, SINK)
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW, False)
    transpose_v = make_v_transpose(DB, THREADS)
    ZERO = float32(0.0)

    # Descriptor arithmetic in 16-byte units (kernels/ptx/wgmma.py): a K-major k32 step is 32
    # bytes along the rows, as a 16-bit k16 step; SUB_N keys of K are SUB_N rows of 128 bytes.
    SBO, k_step = wgmma.SBO, wgmma.k_step
    BUF_STEP = TILE * 2 // 16
    SUB_STEP = SUB_N * wgmma.SWIZZLE_BYTES // 16

    write_rows = make_row_writer(HEAD_DIM, BLOCK_M)
    copy_slot, load_tile, _ = make_swizzled_copy(HEAD_DIM, DB // 2, THREADS, 16)

    def flash_fwd_wgmma_fp8(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                            cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table,
                            window_left, window_right, softcap, alibi_slopes, sink,
                            q_descale, k_descale, v_descale):
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
        base = wgmma.aligned_base(smem)
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x if CAUSAL else cuda.blockIdx.x) * BLOCK_M
        b = int32(convert.div_u32(bh, n_heads_q))
        h = bh - b * n_heads_q
        hk = int32(convert.div_u32(h, group))
        # q's and k's descales scale every score: they join the softmax scale.
        scale_log2 = scale_log2 * q_descale[b, hk] * k_descale[b, hk]

        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], k.shape[1], cu_seqlens_q, cu_seqlens_k,
            seqused_k, status)
        if VARLEN:
            if m0 >= seqlen_q:
                return  # a query tile past the sequence's end
            q, out, lse = q[:, q0:], out[:, q0:], lse[:, :, q0:]
            k, v = k[:, k0:], v[:, k0:]
        k, v, block_table, seqlen_k, rel0, diag, diag_lo = key_view(
            k, v, block_table, m0, diag, seqlen_k, window_left, window_right)
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
        end = kv_end(m0, diag, seqlen_k)
        n_tiles = (end + BLOCK_N - 1) // BLOCK_N if end > 0 else 0

        # Prologue: Q and the first K/V tile in flight together.
        load_tile(smem, base + Q_OFF, q, b, m0, h, BLOCK_M, seqlen_q, copy_r0, copy_c)
        if n_tiles > 0:
            load_tile(smem, base + K_OFF, k, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
            load_tile(smem, base + V_OFF, v, b, 0, hk, BLOCK_N, seqlen_k, copy_r0, copy_c)
        memory.cp_async_commit()

        desc_q = wgmma.descriptor(smem, base + Q_OFF + (tid >> 7) * 64 * wgmma.BLOCK_COLS, 16, SBO)
        desc_k = wgmma.descriptor(smem, base + K_OFF, 16, SBO)
        desc_vt = wgmma.descriptor(smem, base + VT_OFF, 16, SBO)

        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        m_tile = cuda.local.array((1, 2), float32)
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)
        m_start, l_start = sink_start(sink, h, scale_log2)
        for half in range(2):
            m_i[0, half] = m_start
            l_i[0, half] = l_start if t2 == 0 else ZERO
        for dt in range(DT):
            for e in range(4):
                O_i[0, dt, e] = ZERO
        row_g = m0 + 16 * warp + g

        for j in range(n_tiles):
            memory.cp_async_wait(0)  # tile j has landed (for this thread's copies) ...
            sync.proxy_fence()       # ... is visible to wgmma reads ...
            cuda.syncthreads()       # ... for all; every warpgroup is done with tile j - 1 and VT
            if j + 1 < n_tiles:
                nxt = TILE - (j & 1) * TILE
                load_tile(smem, base + K_OFF + nxt, k, b, (j + 1) * BLOCK_N, hk, BLOCK_N,
                          seqlen_k, copy_r0, copy_c)
                load_tile(smem, base + V_OFF + nxt, v, b, (j + 1) * BLOCK_N, hk, BLOCK_N,
                          seqlen_k, copy_r0, copy_c)
                memory.cp_async_commit()
            buf = uint64((j & 1) * BUF_STEP)

            for sub in range(SUBS):
                n0 = j * BLOCK_N + sub * SUB_N
                # S_ij = Q_i K_j^T over this step's SUB_N keys: KSTEPS k32 wgmma.
                wgmma.fence()
                for ks in range(KSTEPS):
                    mma_s(S, 0, desc_q + k_step(ks, BLOCK_M),
                          desc_k + buf + uint64(sub * SUB_STEP) + k_step(ks, BLOCK_N), ks > 0,
                          smem, scratch, tid)
                wgmma.commit()
                if sub == 0:
                    # While the tensor cores multiply: V_j^T into VT, published to wgmma.
                    transpose_v(smem_words, base + V_OFF + (j & 1) * TILE, base + VT_OFF, tid)
                    sync.proxy_fence()
                    cuda.syncthreads()
                wgmma.wait(0)
                wgmma.fence_operands(S, S_REGS)

                softmax_step(S, m_i, l_i, O_i, m_tile, n0, m0, row_g, t2, seqlen_k, diag,
                             diag_lo, scale_log2, mods, shfl_scratch, tid)

                # O_i += e4m3(P_ij) V_j: each k32 step's A registers are four of the thread's
                # own P values each (the renamed keys).
                wgmma.fence()
                for kk in range(PV_STEPS):
                    c = 4 * kk
                    pa = (pack4(S[0, c, 0], S[0, c, 1], S[0, c + 1, 0], S[0, c + 1, 1]),
                          pack4(S[0, c, 2], S[0, c, 3], S[0, c + 1, 2], S[0, c + 1, 3]),
                          pack4(S[0, c + 2, 0], S[0, c + 2, 1], S[0, c + 3, 0], S[0, c + 3, 1]),
                          pack4(S[0, c + 2, 2], S[0, c + 2, 3], S[0, c + 3, 2], S[0, c + 3, 3]))
                    mma_o(O_i, 0, pa, desc_vt + k_step(sub * PV_STEPS + kk, DB), 1, smem,
                          scratch, tid)
                wgmma.commit()
                wgmma.wait(0)
                wgmma.fence_operands(O_i, O_REGS)

        # Epilogue: O_i v_descale / l_i staged over Q and K (16-bit, swizzled), lse_i.
        memory.cp_async_wait(0)
        cuda.syncthreads()    # every warpgroup's wgmma reads of Q and K are behind us
        for mask in (1, 2):
            for half in range(2):
                l_i[0, half] += shfl_xor(l_i[0, half], mask, shfl_scratch, tid)
        v_scale = v_descale[b, hk]
        for half in range(2):
            l = l_i[0, half]
            inv = v_scale / l if l > ZERO else ZERO
            row = 16 * warp + g + 8 * half
            for dt in range(DT_OUT):
                word = uint32(base + O_OFF + wgmma.tile_offset(row, 8 * dt + t2, BLOCK_M)) >> 1
                smem_words[word] = pack_out(O_i[0, dt, 2 * half] * inv,
                                            O_i[0, dt, 2 * half + 1] * inv)
        if t2 == 0:
            for half in range(2):
                l = l_i[0, half]
                row = row_g + 8 * half
                if row < seqlen_q:
                    lse[b, h, row] = lse_of(m_i[0, half] * scale_log2, l)
        cuda.syncthreads()
        write_rows(out, b, m0 + 16 * warp, h, seqlen_q, smem, base + O_OFF, 16 * warp, lane)

    return flash_fwd_wgmma_fp8


# ----------------------------------------------------------------------------- spec

def sub_n(head_dim):
    """Keys per softmax step: 128, or 64 at head dims past 128, where S (SUB_N / 2 registers)
    and O_i (DB / 2) must share a thread's registers."""
    return 128 if head_dim <= 128 else 64


# (BLOCK_M, warps, register cap) by head dim, non-causal and causal: two warpgroups, as the
# 16-bit kernel's 128-row tiles; not swept yet.
TILES = ((256, ((128, 8, 0), (128, 8, 0))),)


class Spec(ForwardSpec):
    name = "flash_fwd_wgmma_fp8"
    unroll_loops = True

    def entry(self, config, device):
        return next(t for limit, t in TILES if config.head_dim <= limit)[int(config.causal)]

    def tiles(self, config, entry):
        bm, warps, regs = entry
        return Tiles(bm, BLOCK_N, 32 * warps, shared_layout(bm, config.head_dim).bytes, regs)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_M, sub_n(config.head_dim),
                                   config.causal, config.out_fmt, config.varlen, config.window,
                                   config.softcap, config.alibi, config.sink)

    def samples(self):
        """Head dim 128 causal or not, 256 causal (its other tile: steps of 64 keys), bfloat16
        out; float16 out at 128; varlen with a window at 128; softcap, ALiBi and a sink at 128
        (head dim 64 is 128's code on padded rows)."""
        def fp8(d, causal, out_fmt="bfloat16", *options):
            config = AttentionConfig(d, causal, FP8_FORMAT, *options)._replace(out_fmt=out_fmt)
            return sample("tc wgmma fp8 fwd", config, ccs=(SM90A,))
        return ([fp8(128, False), fp8(128, True), fp8(256, True)]
                + [fp8(128, False, "float16"),
                   fp8(128, True, "bfloat16", True, False, True),
                   fp8(128, True, "bfloat16", False, False, False, True, True, True)])


SPEC = Spec()
