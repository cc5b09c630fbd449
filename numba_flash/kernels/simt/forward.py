"""FlashAttention forward on CUDA cores: the textbook kernel (chapter 9.4.3, FA2 loop order).

What it computes
    For one (batch, query head) and one tile of BLOCK_M query rows ``Q_i``, the kernel streams
    the key/value tiles ``K_j, V_j`` (BLOCK_N rows each) through shared memory and keeps the
    online-softmax state of each row in registers:

        S_ij = Q_i K_j^T * scale                      (never written to global memory)
        m_new = max(m_i, rowmax(S_ij))
        P_ij = exp(S_ij - m_new)
        l_i  = l_i * exp(m_i - m_new) + rowsum(P_ij)
        O_i  = O_i * exp(m_i - m_new) + P_ij V_j
        m_i  = m_new
    and finally writes ``O_i / l_i`` and ``lse_i = m_i + log(l_i)`` (the statistic the backward
    pass needs to recompute P). Exponentials run in base 2: Q is pre-multiplied by
    ``scale * log2(e)`` so each ``exp`` is one ``ex2`` instruction.

Grid / block mapping
    grid = (ceil(Sq / BLOCK_M), B * Hq); block = 128 threads. Query head ``h`` reads kv head
    ``h // (Hq // Hk)`` (GQA/MQA). Thread ``t`` owns the register micro-tile of rows
    ``(t >> 3) * TM + i`` (TM = BLOCK_M / 16) and, in S, the columns ``(t & 7) + 8 j``
    (TN = BLOCK_N / 8 of them), in O the columns ``(t & 7) + 8 j`` (TD = HEAD_DIM / 8). Each row
    is shared by the 8 consecutive lanes with the same ``t >> 3``, so a row maximum is three
    ``shfl_xor`` steps and the row sum is reduced only once, after the loop (each lane keeps a
    partial ``l_i``: the rescale factor is uniform across the row). A micro-tile of TM x TN
    outputs reads TM + TN shared-memory words per step of the dot product: that ratio, not the
    FLOP count, is what limits a CUDA-core attention kernel.

Shared memory (float32 words, dynamic, see shared_layout)
    Q^T  HEAD_DIM x (BLOCK_M + 1)   transposed so a warp reads consecutive words; +1 pads the
                                    transposing writes off one bank
    K^T  HEAD_DIM x (BLOCK_N + 1)   idem
    V    BLOCK_N x HEAD_DIM
    P    BLOCK_M x (BLOCK_N + P_PAD) P is scattered over the threads of a row, so PV reads it
                                    back from shared memory; P_PAD keeps those reads conflict-free
    e.g. 64 KiB at HEAD_DIM = 64 (BLOCK_M = BLOCK_N = 64): above the 48 KiB static limit, hence
    the opt-in in runtime/launcher.py.

Causal (bottom-right aligned, query i sees keys j <= i + Sk - Sq)
    KV tiles wholly above the diagonal are never loaded; masking is applied only on tiles that
    cross the diagonal or the ragged end of the sequence. Rows with no visible key get
    ``out = 0`` and ``lse = +inf``.

Varlen (packed sequences, kernels/attention.py)
    The grid is sized by max_seqlen_q; each CTA takes its sequence's offsets and lengths from
    ``make_seqlen_info``, returns at once when its query tile lies past the sequence's end, and
    otherwise runs the dense code on views of the arrays from the sequence's first row on.
    Paged K/V (``PAGED``): K and V are pages behind a block table, and each key row is looked up
    in the table as it is loaded (``common/paged_kv.make_key_row``); a bad entry reads as zeros
    and is reported.

Masks and score modifiers (compile-time options: off, they cost nothing)
    ``WINDOW`` (sliding window): the causal code with the diagonal moved right by the window's
    right side, the keys viewed from the first tile (or page) the window reaches, and a lower
    test in the tiles that cross its start (``common/masks.make_key_view``). ``SOFTCAP``,
    ``ALIBI``: each S element (base-2 units here, Q being pre-scaled) becomes the score the
    softmax sees before the masks: ``cap_out tanh(S cap_in)``, then minus the slope times ``|i
    + Sk - Sq - j|`` (``common/score_mods.py``). ``SINK``: each row starts with the sink as a
    key already seen, of value 0 (``m_i = sink``, ``l_i = 1`` on one lane of the row), so it
    joins the row's sum and its lse, and a row that sees no key ends with ``out = 0``, ``lse =
    sink``.

FP8 inputs (``OUT_FMT``: FlashAttention-3's FP8 forward, the readable version)
    float8_e4m3fn q, k, v arrive as bytes and widen to float32 as they are loaded; q's and k's
    descales join the softmax scale and v's scales each finished row, which is written in
    ``OUT_FMT``. P stays float32 here (the tensor-core kernel rounds it to e4m3).

Limits
    HEAD_DIM a multiple of 8 up to 256; any Sq, Sk; strides other than the last honoured.
    Accumulation in float32; inputs float16 / bfloat16 (as uint16 bits), float32, or (compute
    capability 8.9 and up) float8_e4m3fn.
"""

import math
from functools import lru_cache

from numba import cuda, float32

from ...runtime.arrays import FLOAT_FORMATS
from ...runtime.spec import SM80, SM90, Tiles
from ..attention import ForwardSpec, sample
from ..common import constants, formats
from ..common.epilogue import lse_of
from ..common.grid import folded_row
from ..common.layout import SharedLayout
from ..common.masks import (make_key_view, make_kv_end, make_mask, make_needs_mask,
                            make_seqlen_info, make_window)
from ..common.paged_kv import make_key_row
from ..common.score_mods import make_score_mods, make_sink
from ..instructions import sync
from .tiles import LANES_PER_ROW, ROW_GROUPS, THREADS, make_tile_loader, row_pad


def strides(BLOCK_M, BLOCK_N):
    """Row strides (float32 words) of the shared Q^T, K^T and P tiles."""
    # P_PAD puts the four row groups of a warp on different banks: the P reads of PV are then
    # free of bank conflicts.
    return BLOCK_M + 1, BLOCK_N + 1, BLOCK_N + row_pad(BLOCK_M // ROW_GROUPS, BLOCK_N)


def shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM):
    """The four shared tiles, in float32 words (the module's "Shared memory")."""
    q_stride, k_stride, p_stride = strides(BLOCK_M, BLOCK_N)
    return SharedLayout(4, [("q", HEAD_DIM * q_stride), ("k", HEAD_DIM * k_stride),
                            ("v", BLOCK_N * HEAD_DIM), ("p", BLOCK_M * p_stride)])


@lru_cache(maxsize=None)
def make_forward_kernel(HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, FMT, VARLEN=False, PAGED=False,
                        WINDOW=False, SOFTCAP=False, ALIBI=False, SINK=False, OUT_FMT=None):
    """Python kernel function specialised for one configuration (``SPEC`` compiles it).
    ``OUT_FMT`` (FP8 inputs): the outputs' format; the kernel then takes the three descales
    last."""
    FP8 = OUT_FMT is not None
    assert BLOCK_M % ROW_GROUPS == 0 and BLOCK_N % LANES_PER_ROW == 0 and HEAD_DIM % 8 == 0
    TM = BLOCK_M // ROW_GROUPS
    TN = BLOCK_N // LANES_PER_ROW
    TD = HEAD_DIM // LANES_PER_ROW
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM)
    Q_OFF, K_OFF, V_OFF, P_OFF = lay.q, lay.k, lay.v, lay.p
    Q_STRIDE, K_STRIDE, P_STRIDE = strides(BLOCK_M, BLOCK_N)
    SCRATCH = sync.scratch_size(THREADS)
    load_qt = make_tile_loader(BLOCK_M, HEAD_DIM, 1, Q_STRIDE, FMT)  # Q^T: row stride 1
    seqlen_info = make_seqlen_info(VARLEN, PAGED)
    key_row = make_key_row(PAGED)
    kv_end = make_kv_end(BLOCK_M, CAUSAL)
    needs_mask = make_needs_mask(BLOCK_N, CAUSAL)
    masked_out = make_mask(CAUSAL)
    crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)[2]
    key_view = make_key_view(BLOCK_M, BLOCK_N, WINDOW, PAGED)
    score_factors, modified = make_score_mods(True, SOFTCAP, ALIBI)
    sink_start = make_sink(True, SINK)
    load, store = formats.loader(FMT), formats.storer(OUT_FMT or FMT)
    shfl_xor = sync.shfl_xor
    NEG_INF = constants.NEG_INF
    ZERO, ONE = float32(0.0), float32(1.0)

    @cuda.jit(device=True, inline="always")
    def forward(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table, window_left,
                window_right, softcap, alibi_slopes, sink, q_descale, k_descale, v_descale):
        smem = cuda.shared.array(0, float32)
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        lane = tid & (LANES_PER_ROW - 1)
        row0 = (tid >> 3) * TM  # first of this thread's TM rows within the tile
        bh = folded_row()
        if bh >= q.shape[0] * n_heads_q:
            return  # past the last (batch, head): see common/grid.py
        m0 = cuda.blockIdx.x * BLOCK_M
        b = bh // n_heads_q
        h = bh - b * n_heads_q
        hk = h // group
        if FP8:  # stored values times their descales: q's and k's join the softmax scale
            scale_log2 = scale_log2 * q_descale[b, hk] * k_descale[b, hk]
        keys = block_table.shape[1] * k.shape[1] if PAGED else k.shape[1]  # rows of K
        q0, k0, seqlen_q, seqlen_k, diag = seqlen_info(
            b, seqlen_q, seqlen_k, q.shape[1], keys, cu_seqlens_q, cu_seqlens_k, seqused_k,
            status)
        if VARLEN:  # the sequence's rows: each array from its first row on
            if m0 >= seqlen_q:
                return  # a query tile past the sequence's end
            q, out, lse = q[:, q0:], out[:, q0:], lse[:, :, q0:]
            if not PAGED:  # paged keys are found through the table (key_row)
                k, v = k[:, k0:], v[:, k0:]
        # Sliding window: keys from the first tile (or page) it reaches, diagonals relative to it.
        k, v, block_table, seqlen_k, rel0, diag, diag_lo = key_view(
            k, v, block_table, m0, diag, seqlen_k, window_left, window_right)
        mods = score_factors(softcap, alibi_slopes, b, h, scale_log2, rel0)

        # Q_i -> shared (transposed), pre-scaled so that S is in base-2 units.
        load_qt(smem, Q_OFF, q, b, m0, h, seqlen_q, scale_log2, tid)

        # Per-thread online-softmax state, all in registers.
        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)
        O_i = cuda.local.array((TM, TD), float32)
        S = cuda.local.array((TM, TN), float32)
        m_start, l_start = sink_start(sink, h, scale_log2)  # a sink: a key already seen
        for i in range(TM):
            m_i[i] = m_start
            l_i[i] = l_start if lane == 0 else ZERO  # the row's sum is spread over 8 lanes
            for jd in range(TD):
                O_i[i, jd] = ZERO

        # Keys this tile of queries may see: all of them, or (causal) up to the diagonal.
        for n0 in range(0, kv_end(m0, diag, seqlen_k), BLOCK_N):
            cuda.syncthreads()  # the previous tile's K, V, P are no longer read
            # K_j (transposed) and V_j -> shared; rows past the end are zeros. One pass for both
            # (one index and bounds test): two load_tile calls cost a quarter more instructions.
            for idx in range(tid, BLOCK_N * HEAD_DIM, THREADS):
                c = idx // HEAD_DIM
                d = idx - c * HEAD_DIM
                kx = ZERO
                vx = ZERO
                if n0 + c < seqlen_k:
                    # k[b, n0 + c], or (paged) the page and slot the block table gives
                    kb, kr, found = key_row(k, block_table, b, n0 + c, status)
                    if found:
                        kx = load(k[kb, kr, hk, d])
                        vx = load(v[kb, kr, hk, d])
                smem[K_OFF + d * K_STRIDE + c] = kx
                smem[V_OFF + c * HEAD_DIM + d] = vx
            cuda.syncthreads()

            # S_ij = Q_i K_j^T: each thread its TM x TN micro-tile.
            for i in range(TM):
                for j in range(TN):
                    S[i, j] = ZERO
            for d in range(HEAD_DIM):
                for i in range(TM):
                    a = smem[Q_OFF + d * Q_STRIDE + row0 + i]
                    for j in range(TN):
                        S[i, j] += a * smem[K_OFF + d * K_STRIDE + lane + LANES_PER_ROW * j]

            if SOFTCAP or ALIBI:  # in S's base-2 units (common/score_mods.py)
                for i in range(TM):
                    rel = mods[3] + float32(m0 + row0 + i - n0 - lane)  # i + diag - j
                    for j in range(TN):
                        S[i, j] = modified(S[i, j], mods, rel - float32(LANES_PER_ROW * j))[0]

            # Only tiles that cross the ragged end, the diagonal or the window's start.
            if needs_mask(n0, m0, diag, seqlen_k) or crosses_begin(n0, m0, diag_lo):
                for i in range(TM):
                    for j in range(TN):
                        key = n0 + lane + LANES_PER_ROW * j
                        if masked_out(m0 + row0 + i, key, diag, seqlen_k) or (
                                WINDOW and key < m0 + row0 + i + diag_lo):
                            S[i, j] = NEG_INF

            # Online softmax: new row maxima, rescale the old state, P_ij = exp2(S - m_new).
            for i in range(TM):
                mx = S[i, 0]
                for j in range(1, TN):
                    mx = max(mx, S[i, j])
                mx = max(mx, shfl_xor(mx, 1, scratch, tid))
                mx = max(mx, shfl_xor(mx, 2, scratch, tid))
                mx = max(mx, shfl_xor(mx, 4, scratch, tid))
                m_new = max(m_i[i], mx)
                base = m_new if m_new != NEG_INF else ZERO  # a row with nothing visible yet
                alpha = math.exp2(m_i[i] - base)
                m_i[i] = m_new
                row_sum = ZERO
                for j in range(TN):
                    p = math.exp2(S[i, j] - base)
                    row_sum += p
                    smem[P_OFF + (row0 + i) * P_STRIDE + lane + LANES_PER_ROW * j] = p
                l_i[i] = l_i[i] * alpha + row_sum
                for jd in range(TD):
                    O_i[i, jd] *= alpha
            cuda.syncthreads()

            # O_i += P_ij V_j
            for c in range(BLOCK_N):
                for i in range(TM):
                    p = smem[P_OFF + (row0 + i) * P_STRIDE + c]
                    for jd in range(TD):
                        O_i[i, jd] += p * smem[V_OFF + c * HEAD_DIM + lane + LANES_PER_ROW * jd]

        # Epilogue: the full row sums, O_i / l_i and lse_i (natural log).
        for i in range(TM):
            l = l_i[i]
            l += shfl_xor(l, 1, scratch, tid)
            l += shfl_xor(l, 2, scratch, tid)
            l += shfl_xor(l, 4, scratch, tid)
            r = m0 + row0 + i
            if r < seqlen_q:
                scale_out = ONE
                if FP8:  # v's descale scales the finished row
                    scale_out = v_descale[b, hk]
                inv = scale_out / l if l > ZERO else ZERO
                for jd in range(TD):
                    out[b, r, h, lane + LANES_PER_ROW * jd] = store(O_i[i, jd] * inv)
                if lane == 0:
                    lse[b, h, r] = lse_of(m_i[i], l)

    if FP8:
        def flash_fwd_simt_fp8(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group,
                               scale_log2, cu_seqlens_q, cu_seqlens_k, seqused_k, status,
                               block_table, window_left, window_right, softcap, alibi_slopes,
                               sink, q_descale, k_descale, v_descale):
            forward(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                    cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table, window_left,
                    window_right, softcap, alibi_slopes, sink, q_descale, k_descale, v_descale)

        return flash_fwd_simt_fp8

    def flash_fwd_simt(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                       cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table,
                       window_left, window_right, softcap, alibi_slopes, sink):
        forward(q, k, v, out, lse, seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                cu_seqlens_q, cu_seqlens_k, seqused_k, status, block_table, window_left,
                window_right, softcap, alibi_slopes, sink, sink, sink, sink)

    return flash_fwd_simt


# ----------------------------------------------------------------------------- spec

# (BLOCK_M, BLOCK_N) by head dim, set by hand; the grid they run is the nf-simt column of
# bench/results/NVIDIA-H200/attention_fwd_37e5ad0.csv. Larger head dims trade BLOCK_N (shared
# memory, S registers) for the O_i micro-tile, which grows as HEAD_DIM / 8.
TILES = ((64, (64, 64)), (128, (64, 32)), (256, (32, 32)))


class Spec(ForwardSpec):
    name = "flash_fwd_simt"

    def entry(self, config, device):
        return next(t for limit, t in TILES if config.head_dim <= limit)

    def tiles(self, config, entry):
        bm, bn = entry
        return Tiles(bm, bn, THREADS, shared_layout(bm, bn, config.head_dim).bytes)

    def make(self, config, tiles):
        return make_forward_kernel(config.head_dim, tiles.BLOCK_M, tiles.BLOCK_N, config.causal,
                                   config.fmt, config.varlen, config.paged, config.window,
                                   config.softcap, config.alibi, config.sink, config.out_fmt)

    def samples(self):
        """The smallest head dim, the largest of each tile class (causal or not, each format)
        one between classes, one varlen and one paged varlen, a sliding window dense and varlen,
        a softcap, and a paged window with ALiBi and a sink."""
        configs = [(8, True, "bfloat16")]
        configs += [(d, causal, fmt) for d, _ in TILES for causal in (False, True)
                    for fmt in FLOAT_FORMATS]
        configs.append((72, False, "bfloat16"))
        configs.append((64, True, "bfloat16", True))  # varlen
        configs.append((64, True, "bfloat16", True, True))  # varlen, paged K/V
        configs.append((64, True, "float16", False, False, True))  # sliding window
        configs.append((64, True, "bfloat16", True, False, True))  # varlen, sliding window
        configs.append((64, False, "float16", False, False, False, True))  # softcap
        configs.append((64, True, "bfloat16", True, True, True, False, True, True))  # paged
        # window, ALiBi and a sink
        configs.append((128, True, "float8_e4m3fn", True, False, False, False, False, False,
                        "bfloat16"))  # FP8 inputs, varlen
        return [sample("simt fwd", config, ccs=(SM90,) if len(config) > 9 else (SM80, SM90))
                for config in configs]


SPEC = Spec()
