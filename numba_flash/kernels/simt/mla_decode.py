"""Paged MLA decode on CUDA cores: split-KV attention over a block-table cache (FlashMLA's job).

What it computes
    DeepSeek's Multi-head Latent Attention in decode: the ``s_q`` new tokens of a sequence, with
    ``h_q`` heads each, attend that sequence's latent KV cache: ``HEAD_DIM`` (576 = 512 latent
    + 64 rope) columns per cached token and KV head, the first ``HEAD_DIM_V`` of which are also
    the values. The cache lives in pages of ``page_block_size`` tokens; token ``pos`` of request
    ``req`` is slot ``pos % page`` of page ``block_table[req, pos // page]``.

    Every query head of a KV head reads the same cache rows, so the ``s_q * h_q / h_kv`` query
    rows of one KV head are packed into the M dimension of one tile: packed row ``r`` is query
    token ``t = r // group`` of query head ``hk * group + r % group`` (``group = h_q / h_kv``).
    One KV tile in shared memory then serves all of them, K for the scores and its first
    ``HEAD_DIM_V`` columns as V: the cache is read from memory once per tile of query rows.

    The work is dealt out by the MLA tile scheduler (``scheduler.py``): a CTA walks the pieces of
    its metadata row exactly as ``scheduler.part_pieces`` does. For each piece it runs the
    online softmax of the forward kernel over key tiles of BLOCK_N rows,

        S = Q K^T (base 2: Q is pre-scaled by scale * log2 e)
        m_new = max(m_i, rowmax S);  P = exp2(S - m_new);  alpha = exp2(m_i - m_new)
        l_i = alpha l_i + rowsum P;  O_i = alpha O_i + P V;  m_i = m_new

    and then writes the final ``out = O_i / l_i`` and natural-log ``lse`` of a request handled in
    one piece, or, for a piece of a split request, the float32 partial ``O_i / l_i`` and the
    base-2 partial ``m_i + log2 l_i`` into accumulator slot ``num_splits[req] + piece``, which
    ``combine.py`` merges. A row without visible keys gives ``out = 0, lse = +inf`` (partial:
    ``O = 0, lse = -inf``, weight 0 in the combine).

Grid / block mapping
    grid = (num_sm_parts, h_kv, ceil(q_rows / BLOCK_M)); block = THREADS = 256 threads (8 warps).
    One CTA per (SM part, KV head, tile of BLOCK_M packed query rows). Every phase uses the
    thread layout that suits it (``layout`` computes all of them):

    load      warp ``w`` copies cache rows ``w, w + 8, ...`` of the tile, its 32 lanes consecutive
              columns: coalesced, and one block-table lookup per row and warp. The loads of tile
              ``j + 1`` are issued into registers before tile ``j`` is computed, so the memory
              system always has a whole tile in flight (software pipelining: decode is bound by
              how fast the cache streams, and there is one CTA per SM).
    S = QK^T  thread = (row group, key group, d lane): a TM x TN register micro-tile of S over
              the 1 / DS slice ``d = ds + DS * i`` of the head dim. Splitting d lets all 256
              threads share a tile that has few rows (1 query row at h_q = 1: there is nothing
              else to split); more rows widen the micro-tile to TM = 8 rows (8 + TN shared
              loads per 8 TN FMAs). Each d-lane writes its partial sums to its own plane of
              shared memory (one store per value: cheaper than a DS-lane shuffle butterfly).
    softmax   SL lanes per row add the DS partial planes up, mask the keys the row may not
              see, and hold m_i and a partial l_i in registers (the row maximum is an SL-lane
              ``shfl_xor`` reduction); P and the rescale factor alpha go through shared memory
              to the PV layout.
    O += PV   thread = (row group, column lane): a TMo x TDo register micro-tile of O_i, columns
              ``lane + Co * j`` (consecutive threads, consecutive columns: conflict-free V reads
              and coalesced output writes).

Shared memory (float32 words, dynamic; see ``layout``)
    Q     BLOCK_M x HEAD_DIM              the packed query rows, pre-scaled
    KV    BLOCK_N x KV_STRIDE             one cache tile (KV_STRIDE: HEAD_DIM, padded when DS < 32
                                          so that the key groups of a warp read different banks)
    S/P   DS planes of BLOCK_M x P_STRIDE the partial S of each d-lane; then P in plane 0.
                                          DS * BLOCK_M * BLOCK_N = THREADS * TM * TN words
    alpha, l, m   3 x BLOCK_M             per-row values handed between layouts
    Strides are padded so that the lanes of a warp hit different banks (see ``layout``).
    e.g. HEAD_DIM 576, HEAD_DIM_V 512: 78 KiB (BLOCK_M 1, BLOCK_N 32) to 123 KiB (BLOCK_M 32,
    BLOCK_N 8); the tiles per BLOCK_M are chosen in launch.py.

Indexing
    Shared-memory indices and the innermost index of global arrays are cast to uint64. Numba
    gives signed indices Python's negative-index wraparound: a compare and a select per access,
    whose copies, hoisted out of the unrolled loops, cost dozens of registers (BLOCK_M = 32
    spilled) and keep constant offsets from folding into the load instructions.

Limits
    HEAD_DIM a multiple of 8 up to 576, any HEAD_DIM_V <= HEAD_DIM, any page size; BLOCK_N must
    divide the scheduler's 64-row block (so a key tile never straddles two pieces) and be a
    multiple of the warp count. float32 accumulation; float16 / bfloat16 (uint16 bits) or float32.
    Unlike the reference, which gathers the whole sequence, it never touches a cache slot at or
    past ``seqlen`` nor a block-table entry past ``ceil(seqlen / page)``.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint64

from ... import scheduler
from .. import primitives as prim

THREADS = 256  # per CTA on a GPU (the simulator runs fewer: see launch.MLA_THREADS)
MAX_HEAD_DIM = 576
SCHED_BLOCK = scheduler.BLOCK_N  # keys per scheduling block (64)


def _log2(n):
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def _cdiv(a, b):
    return -(-a // b)


def _bank_stride(n, g):
    """Smallest stride >= n that is an odd multiple of g (g a power of two). Rows that many
    words apart start on banks g apart, all different for 32 / g rows: lanes reading g
    consecutive words of each of 32 / g rows then hit 32 different banks."""
    if g >= 32:
        return n
    m = _cdiv(n, g)
    return g * (m + 1 - m % 2)


def layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS=THREADS):
    """Every compile-time constant of one configuration: thread layouts and shared offsets."""
    assert BLOCK_M & (BLOCK_M - 1) == 0 and 1 <= BLOCK_M <= 64, BLOCK_M
    assert THREADS & (THREADS - 1) == 0 and THREADS >= max(32, BLOCK_M), THREADS
    assert SCHED_BLOCK % BLOCK_N == 0 and BLOCK_N % (THREADS // 32) == 0, BLOCK_N
    assert HEAD_DIM % 8 == 0 and HEAD_DIM <= MAX_HEAD_DIM and 1 <= HEAD_DIM_V <= HEAD_DIM
    # S = Q K^T: R row groups x C key groups x DS d-lanes, each thread a TM x TN micro-tile.
    TM = min(BLOCK_M, 8)
    R = BLOCK_M // TM
    lanes = THREADS // R  # >= 32 at 256 threads: one row group per warp reads one set of Q rows
    TN = max(1, min(4, BLOCK_N * 32 // lanes))
    C = BLOCK_N // TN
    DS = lanes // C
    assert C * TN == BLOCK_N and C * DS == lanes and DS <= 32
    # softmax: SL lanes per row, TS scores per lane.
    SL = min(32, THREADS // BLOCK_M)
    TS = _cdiv(BLOCK_N, SL)
    assert SL * TS == BLOCK_N or BLOCK_N < SL
    # O += P V: Ro row groups x Co column lanes, each thread a TMo x TDo micro-tile.
    TMo = min(BLOCK_M, 8)
    Ro = BLOCK_M // TMo
    Co = THREADS // Ro
    TDo = _cdiv(HEAD_DIM_V, Co)
    # Strides that keep the lanes of a warp on different banks: the S phase reads DS words of
    # each of 32 / DS KV rows and writes 32 / DS words of each of DS planes; the softmax reads SL
    # words of each of 32 / SL rows of a plane.
    kv_stride = _bank_stride(HEAD_DIM, DS)
    p_stride = _bank_stride(BLOCK_N, SL)
    plane = _bank_stride(BLOCK_M * p_stride, 32 // DS)
    q_off = 0
    kv_off = q_off + BLOCK_M * HEAD_DIM
    p_off = kv_off + BLOCK_N * kv_stride
    alpha_off = p_off + DS * plane
    l_off = alpha_off + BLOCK_M
    m_off = l_off + BLOCK_M
    return dict(TM=TM, R=R, TN=TN, C=C, DS=DS, SL=SL, TS=TS, TMo=TMo, Ro=Ro, Co=Co, TDo=TDo,
                kv_stride=kv_stride, p_stride=p_stride, plane=plane, q_off=q_off,
                kv_off=kv_off, p_off=p_off, alpha_off=alpha_off, l_off=l_off, m_off=m_off,
                words=m_off + BLOCK_M)


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT):
    """Python kernel function specialised for one configuration (compile with launch.compile)."""
    lay = layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS)
    WARPS = THREADS // 32
    TM, TN, C, DS, SL, TS = (lay[k] for k in ("TM", "TN", "C", "DS", "SL", "TS"))
    TMo, Co, TDo = lay["TMo"], lay["Co"], lay["TDo"]
    LOG_DS, LOG_SL = _log2(DS), _log2(SL)
    KV_STRIDE, P_STRIDE, PLANE = lay["kv_stride"], lay["p_stride"], lay["plane"]
    Q_OFF, KV_OFF, P_OFF = lay["q_off"], lay["kv_off"], lay["p_off"]
    ALPHA_OFF, L_OFF, M_OFF = lay["alpha_off"], lay["l_off"], lay["m_off"]
    D_STEPS, D_TAIL = HEAD_DIM // DS, HEAD_DIM % DS  # d-slice of a thread: ds + DS * i
    COLS = _cdiv(HEAD_DIM, 32)  # columns a lane copies per cache row
    COLS_EXACT = HEAD_DIM % 32 == 0
    DV_EXACT = HEAD_DIM_V % Co == 0
    ROWS_PER_WARP = BLOCK_N // WARPS  # cache rows a warp copies per tile
    Q_ROWS_PER_WARP = _cdiv(BLOCK_M, WARPS)
    SCRATCH = prim.scratch_size(THREADS)
    STORAGE = prim.storage_type(FMT)
    ZERO_BITS = np.float32(0) if FMT == "float32" else np.uint16(0)  # +0.0 in every format
    load, store = prim.loader(FMT), prim.storer(FMT)
    shfl_xor = prim.shfl_xor
    NEG_INF, POS_INF, LN2 = prim.NEG_INF, prim.POS_INF, prim.LN2
    ZERO, ONE = float32(0.0), float32(1.0)
    BEGIN_REQ, END_REQ, BEGIN_BLOCK, END_BLOCK = (scheduler.BEGIN_REQ, scheduler.END_REQ,
                                                  scheduler.BEGIN_BLOCK, scheduler.END_BLOCK)
    BEGIN_SPLIT, FIRST_SPLIT, LAST_SPLIT = (scheduler.BEGIN_SPLIT, scheduler.FIRST_SPLIT,
                                            scheduler.LAST_SPLIT)

    @cuda.jit(device=True, inline="always")
    def fetch_tile(kbuf, k_cache, block_table, req, hk, n0, n_end, page_size, warp, lane):
        """Issue the loads of cache rows [n0, n0 + BLOCK_N) into registers; rows at or past
        n_end are not read (their block-table entries and slots may be garbage) but zeroed."""
        for jj in range(ROWS_PER_WARP):
            pos = n0 + warp + WARPS * jj
            if pos < n_end:
                blk = pos // page_size
                page = block_table[req, blk]
                slot = pos - blk * page_size
                for ii in range(COLS):
                    d = lane + 32 * ii
                    if COLS_EXACT or d < HEAD_DIM:
                        kbuf[jj, ii] = k_cache[page, slot, hk, uint64(d)]
            else:
                for ii in range(COLS):
                    kbuf[jj, ii] = ZERO_BITS

    def mla_decode_simt(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                        o_acc, lse_acc, s_q, group, page_size, scale_log2):
        smem = cuda.shared.array(0, float32)
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        part = cuda.blockIdx.x
        hk = cuda.blockIdx.y
        m0 = cuda.blockIdx.z * BLOCK_M
        batch = cache_seqlens.shape[0]
        begin_req = metadata[part, BEGIN_REQ]
        if begin_req >= batch:
            return  # idle part
        end_req = metadata[part, END_REQ]
        q_rows = s_q * group

        # This thread's place in each layout (see the module docstring) and its first word in
        # the shared tiles it reads in that layout.
        ds = tid & (DS - 1)  # S = QK^T: d-lane,
        kg = (tid >> LOG_DS) % C  # key group,
        s_row0 = (tid // (DS * C)) * TM  # first row of the micro-tile
        q_at = Q_OFF + s_row0 * HEAD_DIM + ds  # Q[s_row0, ds]
        k_at = KV_OFF + kg * KV_STRIDE + ds  # K[kg, ds]
        part_at = P_OFF + ds * PLANE + s_row0 * P_STRIDE + kg  # plane ds, S[s_row0, kg]
        srow = tid >> LOG_SL  # softmax: row,
        sl = tid & (SL - 1)  # lane in the row
        p_at = P_OFF + srow * P_STRIDE + sl  # plane 0, S[srow, sl]
        o_row0 = (tid // Co) * TMo  # O += PV: first row of the micro-tile,
        co = tid % Co  # first column

        kbuf = cuda.local.array((ROWS_PER_WARP, COLS), STORAGE)
        S = cuda.local.array((TM, TN), float32)
        kv = cuda.local.array(TN, float32)
        sv = cuda.local.array(TS, float32)
        O_i = cuda.local.array((TMo, TDo), float32)
        vv = cuda.local.array(TDo, float32)

        for req in range(begin_req, end_req + 1):
            # The piece of `req` this part handles (scheduler.part_pieces, on the device).
            first = req == begin_req
            last = req == end_req
            seqlen = cache_seqlens[req]
            blk_lo = metadata[part, BEGIN_BLOCK] if first else 0
            blk_hi = metadata[part, END_BLOCK] if last else (max(seqlen - 1, 0) // SCHED_BLOCK + 1)
            n_lo = blk_lo * SCHED_BLOCK
            n_hi = min(blk_hi * SCHED_BLOCK, seqlen)
            piece = metadata[part, BEGIN_SPLIT] if first else 0
            split = metadata[part, FIRST_SPLIT] if first else (
                metadata[part, LAST_SPLIT] if last else 0)
            slot = num_splits[req] + piece

            cuda.syncthreads()  # the previous piece's Q tile and row statistics are read
            # Q_i -> shared, pre-scaled so that S is in base-2 units; padding rows are zeros.
            for jr in range(Q_ROWS_PER_WARP):
                r = warp + WARPS * jr
                if r < BLOCK_M:
                    gr = m0 + r
                    t = gr // group
                    h = hk * group + gr - t * group
                    for ii in range(COLS):
                        d = lane + 32 * ii
                        if COLS_EXACT or d < HEAD_DIM:
                            x = ZERO
                            if gr < q_rows:
                                x = load(q[req, t, h, uint64(d)]) * scale_log2
                            smem[uint64(Q_OFF + r * HEAD_DIM + d)] = x

            # Keys the softmax row may see: all, or (causal) those before its token's diagonal.
            visible = seqlen
            if CAUSAL:
                visible = min(seqlen - (s_q - 1 - (m0 + srow) // group), seqlen)
            m_i = NEG_INF
            l_i = ZERO  # partial: this lane's share of the row sum
            for im in range(TMo):
                for jd in range(TDo):
                    O_i[im, jd] = ZERO

            fetch_tile(kbuf, k_cache, block_table, req, hk, n_lo, n_hi, page_size, warp, lane)
            for n0 in range(n_lo, n_hi, BLOCK_N):
                cuda.syncthreads()  # the previous tile's KV and P are no longer read
                for jj in range(ROWS_PER_WARP):
                    c = warp + WARPS * jj
                    for ii in range(COLS):
                        d = lane + 32 * ii
                        if COLS_EXACT or d < HEAD_DIM:
                            smem[uint64(KV_OFF + c * KV_STRIDE + d)] = load(kbuf[jj, ii])
                cuda.syncthreads()
                # Prefetch: the next tile's loads fly while this one is computed.
                fetch_tile(kbuf, k_cache, block_table, req, hk, n0 + BLOCK_N, n_hi, page_size,
                           warp, lane)

                # S = Q K^T: each thread the micro-tile over its d-slice, one partial sum per
                # d-lane ds, written to plane ds (the softmax adds the DS planes up).
                for im in range(TM):
                    for jn in range(TN):
                        S[im, jn] = ZERO
                for i in range(D_STEPS + (1 if D_TAIL else 0)):
                    if i < D_STEPS or ds < D_TAIL:  # column d = ds + DS * i
                        for jn in range(TN):
                            kv[jn] = smem[uint64(k_at + C * KV_STRIDE * jn + DS * i)]
                        for im in range(TM):
                            a = smem[uint64(q_at + HEAD_DIM * im + DS * i)]
                            for jn in range(TN):
                                S[im, jn] += a * kv[jn]
                for im in range(TM):
                    for jn in range(TN):
                        smem[uint64(part_at + P_STRIDE * im + C * jn)] = S[im, jn]
                cuda.syncthreads()

                # Online softmax, SL lanes per row: the scores (masked), the new maximum,
                # P = exp2(S - m_new) (over plane 0) and the rescale factor alpha.
                mx = NEG_INF
                for j in range(TS):
                    c = sl + SL * j
                    s = NEG_INF
                    if srow < BLOCK_M and c < BLOCK_N and n0 + c < visible:
                        s = ZERO
                        for plane in range(DS):
                            s += smem[uint64(p_at + PLANE * plane + SL * j)]
                    sv[j] = s
                    mx = max(mx, s)
                for k in range(LOG_SL):
                    mx = max(mx, shfl_xor(mx, 1 << k, scratch, tid))
                m_new = max(m_i, mx)
                base = m_new if m_new != NEG_INF else ZERO  # a row with nothing visible yet
                alpha = math.exp2(m_i - base)
                m_i = m_new
                row_sum = ZERO
                for j in range(TS):
                    p = math.exp2(sv[j] - base)
                    row_sum += p
                    c = sl + SL * j
                    if srow < BLOCK_M and c < BLOCK_N:
                        smem[uint64(p_at + SL * j)] = p
                l_i = l_i * alpha + row_sum
                if srow < BLOCK_M and sl == 0:
                    smem[uint64(ALPHA_OFF + srow)] = alpha
                cuda.syncthreads()

                # O_i = alpha O_i + P V, V being the first HEAD_DIM_V columns of the same tile.
                for im in range(TMo):
                    a = smem[uint64(ALPHA_OFF + o_row0 + im)]
                    for jd in range(TDo):
                        O_i[im, jd] *= a
                for c in range(BLOCK_N):
                    for jd in range(TDo):
                        col = co + Co * jd
                        vv[jd] = ZERO
                        if DV_EXACT or col < HEAD_DIM_V:
                            vv[jd] = smem[uint64(KV_OFF + c * KV_STRIDE + col)]
                    for im in range(TMo):
                        p = smem[uint64(P_OFF + (o_row0 + im) * P_STRIDE + c)]
                        for jd in range(TDo):
                            O_i[im, jd] += p * vv[jd]

            # Epilogue: full row sums, then O_i / l_i and the lse, final or partial.
            for k in range(LOG_SL):
                l_i += shfl_xor(l_i, 1 << k, scratch, tid)
            if srow < BLOCK_M and sl == 0:
                smem[uint64(L_OFF + srow)] = l_i
                smem[uint64(M_OFF + srow)] = m_i
            cuda.syncthreads()
            for im in range(TMo):
                r = o_row0 + im
                gr = m0 + r
                if gr < q_rows:
                    t = gr // group
                    h = hk * group + gr - t * group
                    l = smem[uint64(L_OFF + r)]
                    inv = ONE / l if l > ZERO else ZERO
                    for jd in range(TDo):
                        col = co + Co * jd
                        if DV_EXACT or col < HEAD_DIM_V:
                            if split:
                                o_acc[slot, t, h, uint64(col)] = O_i[im, jd] * inv
                            else:
                                out[req, t, h, uint64(col)] = store(O_i[im, jd] * inv)
                    if co == 0:
                        lse2 = smem[uint64(M_OFF + r)] + math.log2(l) if l > ZERO else NEG_INF
                        if split:
                            lse_acc[slot, h, t] = lse2
                        else:
                            lse[req, h, t] = lse2 * LN2 if l > ZERO else POS_INF

    return mla_decode_simt
