"""Decode against a KV cache on tensor cores (``mma.sync``): ``flash_attn_with_kvcache``'s decode.

What it computes
    The attention of ``s_q`` new query tokens against a sequence's cached keys and values, K and
    V in caches of their own (contiguous, or pages behind a block table), keys from
    ``key_start[req]`` on (``cache_leftpad``), causal bottom-right when ``s_q > 1``. The work
    is FlashMLA's: the planner (``simt/mla_metadata.py``) deals every sequence's keys out to
    ``num_sm_parts`` parts, a CTA walks its part's pieces (``common/paged_kv.py``), and pieces
    cut from a longer sequence leave float32 partials for the lse combine
    (``simt/combine.py``). The SIMT decode (``simt/mla_decode.py``) computes the same thing;
    read it first.

Why tensor cores, and GQA packing
    A decode reads each cached key and value once per KV head and does little with it: a GQA
    group of ``group = h_q / h_kv`` query heads makes ``s_q group`` packed query rows (row
    ``r`` is token ``r / group`` of head ``hk group + r % group``, FA3's pack_gqa), and every
    one of them uses the same K/V tile. On CUDA cores those rows cost one FMA per row, key and
    column: at a group of 4, 16 flops per 4 bytes read, enough to hold an H200 near 2.7 TB/s
    instead of its 4.2 TB/s copy rate. One ``mma.sync.m16n8k16`` takes 16 rows at once; rows
    past ``s_q group`` are zero and never stored, tensor-core work the memory bound hides.

Grid / block mapping
    grid = (parts, h_kv, ceil(s_q group / 16)); block = WARPS warps. BLOCK_M = 16 packed rows,
    one m16 tile that every warp shares; BLOCK_N = 16 WARPS keys per cache tile, and warp ``w``
    takes keys ``16 w .. 16 w + 15`` of every tile: FlashDecoding's split of the keys, inside
    the CTA. Each warp runs its own online softmax over its keys (m_i, l_i, O_i of all 16 rows
    and HEAD_DIM_V columns, in the C-fragment layout of ``forward_mma.py``) and never waits for
    another warp but at the ring's one barrier per tile. S of a warp is 16 x 16: the C fragments
    of its two 8-key halves, rounded to 16 bits, are the A fragment of ``O_i += P V`` (the
    products of ``forward_mma.make_products``). At a piece's end the WARPS partial states merge
    through shared memory: every row takes the maximum ``M`` of the warps' m_i, each warp
    scales its O_i by ``exp2(m_i - M) / L`` (L the rescaled sum of the warps' l_i), and the
    scaled partials are added up column by column on their way out.

Masks and score modifiers (``WINDOW``, ``SOFTCAP``, ``ALIBI``: compile-time, off they cost nothing)
    flash-attn's sliding window, softcap and ALiBi in the view of the keys ``key_start`` begins,
    where token t has ``diag = seqlen - s_q`` (``common/paged_kv.make_row_modifiers``): each
    row's window tightens its key limit and sets its first key, S becomes the score the
    softmax sees before the masks (each row with its own head's slope). The keys before the
    first token's window never reach the plan: ``simt/kvcache_prepare.py`` moves the view's
    start past them.

Memory pipeline
    The cache streams through a ring of NSTAGES tiles (``paged_kv.make_kv_ring``): a tile row
    holds a key's HEAD_DIM columns, then its value's HEAD_DIM_V columns, both copied in 16-byte
    ``cp.async`` chunks from the same block-table lookup, 8 threads per row so that a warp's
    copy instruction moves whole 128-byte lines (``make_kv_ring`` says why); NSTAGES - 1 tiles
    are in flight while one is multiplied, one barrier per tile. Q's 16 rows
    are copied with the piece's first tile.

FP8 caches (``CACHE = "e4m3"``, compile-time)
    float8_e4m3fn caches stream as bytes, half those of a 16-bit cache: a 16-byte chunk holds
    16 values and lands in the upper half of the 32 bytes they take as 16-bit values; once its
    ``cp.async`` wait returns, the thread that copied it widens it there (``cvt.rn.f16x2.e4m3x2``;
    exact, e4m3 being a subset of float16 and bfloat16), before the tile's barrier. The
    products then read the same tile as for a 16-bit cache, and the descales stay in float32:
    ``k_descale[b, hk]`` multiplies the piece's softmax scale (S = q k8^T is exact until then),
    ``v_descale[b, hk]`` the finished rows. Shared memory is that of a 16-bit cache.

Shared memory (16-bit elements; rows padded by 8 elements so the 8 row addresses of an
ldmatrix fall in 8 different 16-byte bank groups)
    Q      16 x (HEAD_DIM + 8)
    ring   NSTAGES x BLOCK_N x (HEAD_DIM + HEAD_DIM_V + 8)
    stage  WARPS x 16 x (HEAD_DIM_V + 4) float32, the piece end's partials, over the ring
    + 2 WARPS 16 floats (static) for the warps' m_i and l_i. HEAD_DIM 128, 4 warps, 2 stages:
    4.3 + 66 KiB, three CTAs per SM on an H200, two on an A100; the plan deals one part to each
    (``Spec.parts_per_sm``).

Limits
    float16 / bfloat16 (FP8 caches: compute capability 8.9 or newer); HEAD_DIM and HEAD_DIM_V
    multiples of 16 up to 256 on sm_90, 128 on sm_8x (``max_head_dim``: more spills there); q and both caches in
    rows of 16-byte chunks (``arrays.rows_16_byte_aligned``; the API sends other views to the
    SIMT decode); any page size; compute capability 8.0 or newer. No table entry, length,
    left padding or metadata value can move a copy or a store outside its array
    (``common/paged_kv.py``).
"""

from functools import lru_cache

from numba import cuda, float32, int32, types, uint16, uint32

from ...runtime.device import SHARED_RESERVED_PER_BLOCK
from ...runtime.spec import SM80, SM90, Sample, Tiles
from ..attention import KVCacheDecodeSpec
from ..common import constants
from ..common.layout import SharedLayout
from ..common.paged_kv import SCHED_BLOCK, make_kv_ring, make_paged_kv_walk, make_row_copy
from ..common.paged_kv import make_row_keys, make_row_modifiers
from ..common.softmax import make_online_update, make_row_max
from ..instructions import convert, memory, sync
from ..instructions import mma as mma_sync
from .forward_mma import make_products

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
PAD = 8  # elements of row padding in shared memory (16 bytes)
STAGE_PAD = 4  # floats of padding per staged partial row
MAX_HEAD_DIM, MAX_HEAD_DIM_SM8X = 256, 128
BLOCK_M = 16

# (WARPS, NSTAGES): the first whose shared memory fits the device's block is taken. BLOCK_N =
# 16 WARPS divides SCHED_BLOCK, so a tile never straddles two pieces. Two stages: three CTAs
# share an SM (Spec.parts_per_sm), which streams faster than two CTAs of three stages.
TILES = ((4, 2),)


def max_head_dim(cc):
    """The largest head dim on compute capability ``cc``: at 256 columns O_i is 128 floats per
    thread, which ptxas keeps in registers for sm_90 but spills for sm_80."""
    return MAX_HEAD_DIM if tuple(cc[:2]) >= (9, 0) else MAX_HEAD_DIM_SM8X


def supports(head_dim, head_dim_v, cc=(9, 0)):
    """Whether this kernel takes the head dims on ``cc`` (other ones run the simt decode)."""
    top = max_head_dim(cc)
    return all(d % 16 == 0 and 0 < d <= top for d in (head_dim, head_dim_v))


def kv_stride(head_dim, head_dim_v):
    """Elements between rows of a ring tile: the key, the value, 8 elements of padding."""
    return head_dim + head_dim_v + PAD


def shared_layout(warps, nstages, head_dim, head_dim_v):
    """Q, the ring and, over the ring, the piece end's staged partials (float32)."""
    block_n = 16 * warps
    stage = warps * BLOCK_M * (head_dim_v + STAGE_PAD) * 2  # float32 words in 16-bit elements
    return SharedLayout(2, [("q", BLOCK_M * (head_dim + PAD)),
                            ("ring", nstages * block_n * kv_stride(head_dim, head_dim_v)),
                            ("stage", stage, "ring")])


def static_bytes(warps):
    """Static shared memory of one CTA on a GPU: the warps' m_i and l_i, two scratch words."""
    return 2 * 4 * warps * BLOCK_M + 8


@lru_cache(maxsize=None)
def make_kvcache_decode_kernel(HEAD_DIM, HEAD_DIM_V, CAUSAL, FMT, WARPS, NSTAGES, LEFTPAD,
                               WINDOW=False, SOFTCAP=False, ALIBI=False, CACHE=None):
    """Python kernel function for one configuration (``SPEC`` compiles it)."""
    assert CACHE in (None, "e4m3")
    CACHE_FP8 = CACHE == "e4m3"
    assert FMT in ("float16", "bfloat16") and supports(HEAD_DIM, HEAD_DIM_V)  # (on sm_90)
    BLOCK_N = 16 * WARPS
    assert SCHED_BLOCK % BLOCK_N == 0
    THREADS = 32 * WARPS
    TPR = 8                            # copy: threads per cache row (a 128-byte line each)
    ROWS = BLOCK_N * TPR // THREADS    # ... cache rows per thread and tile
    Q_TPR = THREADS // BLOCK_M         # ... per query row
    Q_STRIDE = HEAD_DIM + PAD
    KV_STRIDE = kv_stride(HEAD_DIM, HEAD_DIM_V)
    STAGE_STRIDE = HEAD_DIM_V + STAGE_PAD
    LAYOUT = shared_layout(WARPS, NSTAGES, HEAD_DIM, HEAD_DIM_V)
    Q_OFF, RING_OFF = LAYOUT.q, LAYOUT.ring
    STAGE_OFF = LAYOUT.stage // 2      # in float32 words
    SLOT = BLOCK_N * KV_STRIDE         # elements of one ring tile
    NT, DT = 2, HEAD_DIM_V // 8        # 8-key tiles of a warp's S, 8-column tiles of its O_i
    WARP_ROWS = WARPS * BLOCK_M        # entries of the m_i / l_i exchange
    OUT_COLS = -(-HEAD_DIM_V // THREADS)  # output columns per thread and row
    SCRATCH = mma_sync.scratch_size(THREADS)
    SHFL_SCRATCH = sync.scratch_size(THREADS)
    # One m16 tile and one 16-key k-step of P V: the products never step by a row stride
    # (Q's and the ring's differ).
    scores, accumulate = make_products(1, NT, DT, HEAD_DIM // 16, KV_STRIDE, FMT)
    row_max = make_row_max(1, NT)
    update = make_online_update(1, NT, DT)
    start_rows, mask_keys = make_row_keys(CAUSAL, NT, DT)
    row_mods, modify_keys = make_row_modifiers(NT, WINDOW, SOFTCAP, ALIBI)
    cta_work, piece_of, _, _, put, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, True)
    first_key, ring_start, ring_next = make_kv_ring(
        HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, TPR, FMT, True, RING_OFF, KV_STRIDE,
        NSTAGES, True, LEFTPAD, CACHE)
    copy_q = make_row_copy(HEAD_DIM, Q_TPR, FMT, True)
    exp2 = convert.exp2_approx
    shfl_xor = sync.shfl_xor
    NEG_INF = constants.NEG_INF
    ZERO, ONE = float32(0.0), float32(1.0)

    @cuda.jit(device=True, inline="always")
    def merged_row(xm, xl, r, scale_log2):
        """(M, L) of row r over the warps: the largest m_i, and the l_i rescaled to it."""
        M = xm[r]
        for w in range(1, WARPS):
            M = max(M, xm[BLOCK_M * w + r])
        L = ZERO
        if M != NEG_INF:
            for w in range(WARPS):
                L += xl[BLOCK_M * w + r] * exp2((xm[BLOCK_M * w + r] - M) * scale_log2)
        return M, L

    @cuda.jit(device=True, inline="always")
    def finish_piece(out, lse, o_acc, lse_acc, floats, xm, xl, shfl_scratch, O_i, m_i, l_i, req,
                     split, slot, q_rows, group, m0, hk, scale_log2, v_scale, warp, g, t2, tid,
                     status):
        """Merge the warps' partial states of the piece's rows and write them out (final rows
        and natural-log lse, or a split's float32 partials and base-2 lse); ``v_scale``: the FP8
        value cache's descale."""
        for mask in (1, 2):  # each warp's full row sums (the quad held column partials)
            for half in range(2):
                l_i[0, half] += shfl_xor(l_i[0, half], mask, shfl_scratch, tid)
        memory.cp_async_wait_all()
        if t2 == 0:
            for half in range(2):
                xm[BLOCK_M * warp + g + 8 * half] = m_i[0, half]
                xl[BLOCK_M * warp + g + 8 * half] = l_i[0, half]
        cuda.syncthreads()  # the ring is idle and every warp's m_i, l_i are out
        for half in range(2):
            r = g + 8 * half
            M, L = merged_row(xm, xl, r, scale_log2)
            f = ZERO
            if L > ZERO and m_i[0, half] != NEG_INF:
                f = exp2((m_i[0, half] - M) * scale_log2) / L
                if CACHE_FP8:
                    f *= v_scale
            at = STAGE_OFF + (BLOCK_M * warp + r) * STAGE_STRIDE + t2
            for dt in range(DT):
                floats[at + 8 * dt] = O_i[0, dt, 2 * half] * f
                floats[at + 8 * dt + 1] = O_i[0, dt, 2 * half + 1] * f
        cuda.syncthreads()  # the partials are staged
        rows = min(q_rows - m0, BLOCK_M)
        for r in range(rows):
            gr = m0 + r
            t = int32(convert.div_u32(gr, group))
            h = hk * group + gr - t * group
            for k in range(OUT_COLS):
                col = tid + THREADS * k
                if HEAD_DIM_V % THREADS == 0 or col < HEAD_DIM_V:
                    x = ZERO
                    for w in range(WARPS):
                        x += floats[STAGE_OFF + (BLOCK_M * w + r) * STAGE_STRIDE + col]
                    put(out, o_acc, split, req, slot, t, h, col, x, status)
            if tid == 0:
                M, L = merged_row(xm, xl, r, scale_log2)
                put_lse(lse, lse_acc, split, req, slot, t, h, M * scale_log2, L, status)

    def kvcache_decode_mma(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out,
                           lse, o_acc, lse_acc, status, s_q, group, page_size, scale_log2,
                           v_cache, key_start, window_left, window_right, softcap,
                           alibi_slopes, k_descale, v_descale):
        smem = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)  # the same bytes
        floats = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)  # the same bytes
        xm = cuda.shared.array(WARP_ROWS, float32)
        xl = cuda.shared.array(WARP_ROWS, float32)
        scratch = cuda.shared.array(SCRATCH, uint32)
        shfl_scratch = cuda.shared.array(SHFL_SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t2 = (lane & 3) * 2
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        row = tid // TPR  # copy: this thread's first row of every cache tile,
        rl = tid % TPR    # its lane in the row
        src = cuda.local.array((2, ROWS), int32)  # ... where its rows lie (make_kv_ring),
        valid = cuda.local.array(ROWS, types.boolean)  # ... and whether they are read
        q_row = tid // Q_TPR  # ... and of Q
        q_rl = tid % Q_TPR

        # Each lane's ldmatrix row address, up to the ring slot: Q as the A operand, the warp's
        # 16 keys as the B operand of S, the same rows' values through .trans for P V.
        a_row, a_col = mma_sync.ldmatrix_a_rowcol(lane)
        b_row, b_col = mma_sync.ldmatrix_b_rowcol(lane)
        q_lane = Q_OFF + a_row * Q_STRIDE + a_col
        k_lane = RING_OFF + (16 * warp + b_row) * KV_STRIDE + b_col
        v_lane = RING_OFF + (16 * warp + a_row) * KV_STRIDE + a_col + HEAD_DIM
        key_lane = 16 * warp + t2  # the thread's first key column in a tile

        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        m_tile = cuda.local.array((1, 2), float32)
        limit = cuda.local.array(2, int32)
        begin = cuda.local.array(2, int32)  # (window) each row's first key
        O_i = cuda.local.array((1, DT, 4), float32)
        S = cuda.local.array((1, NT, 4), float32)
        q_frag = cuda.local.array((1, 4), uint32)

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits, part,
                                                       req, begin_req, end_req, status)
            cuda.syncthreads()  # the previous piece's partials are written out
            # An FP8 cache's descales: k's scales the scores (S = q k8^T stays exact in float32
            # until the softmax), v's the finished rows.
            piece_scale, v_scale = scale_log2, ONE
            if CACHE_FP8:
                piece_scale = scale_log2 * k_descale[req, hk]
                v_scale = v_descale[req, hk]
            # Q with the first tile: packed row m0 + q_row is token tq of head hq.
            gq = m0 + q_row
            q_ok = gq < q_rows
            tq = int32(convert.div_u32(gq, group)) if q_ok else int32(0)
            hq = int32(hk * group + gq - tq * group) if q_ok else int32(0)
            copy_q(smem, Q_OFF + q_row * Q_STRIDE, q, hq, req, tq, q_ok, q_rl)
            key0 = first_key(key_start, req)
            ring_start(smem, k_cache, v_cache, block_table, num_pages, req, hk, key0, n_lo, n_hi,
                       row, rl, src, valid, page_size, status)
            start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, m0 + g)
            mods0, mods1 = row_mods(limit, begin, softcap, alibi_slopes, req, hk, seqlen, s_q,
                                    group, q_rows, m0 + g, window_left, window_right,
                                    piece_scale)

            rd = 0  # ring slot of the tile computed now
            for n0 in range(n_lo, n_hi, BLOCK_N):
                ring_next(smem, words, k_cache, v_cache, block_table, num_pages, req, hk, key0, n0,
                          n_hi, rd, row, rl, src, valid, page_size, status)
                at = rd * SLOT
                scores(S, q_frag, q_lane, k_lane + at, smem, scratch, tid)
                modify_keys(S, begin, mods0, mods1, n0 + key_lane)  # softcap, ALiBi, window
                mask_keys(S, limit, n0 + key_lane)  # past the piece, or (causal) the diagonal
                row_max(S, m_tile, shfl_scratch, tid)
                update(S, m_i, l_i, O_i, m_tile, piece_scale)
                accumulate(O_i, S, v_lane + at, smem, scratch, tid)
                rd = rd + 1 if rd + 1 < NSTAGES else 0

            finish_piece(out, lse, o_acc, lse_acc, floats, xm, xl, shfl_scratch, O_i, m_i, l_i,
                         req, split, slot, q_rows, group, m0, hk, piece_scale, v_scale, warp, g,
                         t2, tid, status)

    return kvcache_decode_mma


# ----------------------------------------------------------------------------- spec

class Spec(KVCacheDecodeSpec):
    name = "kvcache_decode_mma"
    unroll_loops = True

    def parts_per_sm(self, config, device):
        """The CTAs whose shared memory fits on one SM (taken as the block limit plus the 1 KiB
        the driver reserves per block): one wave of them. On an H200 (B 64, h_kv 8, 4k-8k keys)
        three CTAs of two stages and three parts per SM read 3.3-3.6 TB/s, where three parts
        for two resident CTAs (three stages) read 2.3-2.8 and two parts read 3.0-3.6."""
        tiles = self.choose(config, device)
        per_cta = tiles.shared_bytes + static_bytes(tiles.threads // 32) + SHARED_RESERVED_PER_BLOCK
        return max(1, (device.shared_per_block + SHARED_RESERVED_PER_BLOCK) // per_cta)

    def entry(self, config, device):
        limit = device.shared_per_block if device is not None else None
        fits = [t for t in TILES if limit is None or self.tiles(config, t).shared_bytes
                + static_bytes(t[0]) <= limit]
        return (fits or TILES[-1:])[0]

    def tiles(self, config, entry):
        warps, nstages = entry
        return Tiles(BLOCK_M, 16 * warps, 32 * warps,
                     shared_layout(warps, nstages, config.head_dim, config.head_dim_v).bytes)

    def make(self, config, tiles):
        d, dv = config.head_dim, config.head_dim_v
        ring = tiles.shared_bytes // 2 - BLOCK_M * (d + PAD)  # elements (the stage fits in it)
        nstages = ring // (tiles.BLOCK_N * kv_stride(d, dv))
        return make_kvcache_decode_kernel(config.head_dim, config.head_dim_v, config.causal,
                                          config.fmt, tiles.threads // 32, nstages,
                                          config.leftpad, config.window, config.softcap,
                                          config.alibi, config.cache)

    def samples(self):
        """A decode step of a GQA group of 4 (D 128, left padding), a causal chunk of 3 tokens
        of 8 heads at D 64, D 256, and a causal chunk with a window, a softcap and ALiBi; FP8
        caches at D 128 and 256; every table entry."""
        cases = (("q_rows=4 d=128 leftpad bfloat16", (4, 128, 128, False, "bfloat16", True, False,
                                                      True, True)),
                 ("q_rows=24 d=64 causal float16", (24, 64, 64, True, "float16", True, False,
                                                    True, False)),
                 ("q_rows=8 d=256 bfloat16", (8, 256, 256, False, "bfloat16", True, False, True,
                                              False)),
                 ("q_rows=8 d=128 window softcap alibi bfloat16",
                  (8, 128, 128, True, "bfloat16", True, False, True, True, True, True, True)))
        fp8 = (("q_rows=4 d=128 fp8 cache bfloat16", (4, 128, 128, False, "bfloat16", True, False,
                                                      True, False, False, False, False, "e4m3")),
               ("q_rows=8 d=256 fp8 cache float16", (8, 256, 256, False, "float16", True, False,
                                                     True, True, False, False, False, "e4m3")))
        return [Sample(f"tc kvcache {label} tiles={entry}", config, entry,
                       ccs=(SM90,) if config[1] > MAX_HEAD_DIM_SM8X else (SM80, SM90))
                for entry in TILES for label, config in cases] + [
            Sample(f"tc kvcache {label} tiles={entry}", config, entry, ccs=(SM90,))
            for entry in TILES for label, config in fp8]  # (e4m3 conversions: sm_89+)


SPEC = Spec()
