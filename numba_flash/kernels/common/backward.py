"""The steps both tensor-core backwards (``tc/backward_mma.py``, ``tc/backward_wgmma.py``) share,
on the registers of mma C fragments: the forward's lse and the preprocess' D_i read for a tile
of queries, and the recomputation of P and dS from the S and dP accumulators.

With ``lse_i log2 e`` read once per query row, a score tile recomputes the forward's softmax and
its gradient elementwise:

    P_ij  = exp2(S_ij scale_log2 - lse_i log2 e)
    dS_ij = P_ij (dP_ij - D_i)

A query past the end (or one that sees no key: its lse is +inf) gets lse = +inf and D_i = 0, so
its P is 0 without a test; keys past the end and above the causal diagonal are masked to P = 0
where the tile crosses them (``common/masks.py``).

dQ holds the queries: a thread's fragment rows ``row_g`` and ``row_g + 8`` are two queries, whose
lse and D_i stay in registers (``make_dq_rows``, ``make_dq_scores_to_ds``). dK/dV holds the keys
and computes the transposed products, keys as the fragment rows and queries as the columns: the
query tile's lse and D_i are staged in shared memory once per tile (``make_dkdv_rows``) and read
per column (``make_dkdv_scores_to_ds``).
"""

from numba import cuda, float32

from ..instructions import convert, sync, wgmma
from . import constants
from .masks import make_mask, make_needs_mask, make_window
from .score_mods import make_score_mods


def make_dq_rows(WITH_DELTA=True):
    """``load_rows(lse_r, D_r, lse, delta, b, h, row_g, seqlen_q)``: lse_i log2 e and D_i of the
    thread's two fragment rows ``row_g`` and ``row_g + 8`` into lse_r (2,) and D_r (2,), +inf
    and 0 past the queries (P = 0 there). ``WITH_DELTA=False``: D_r = 0 and delta unread (a
    kernel that computes D_i itself, ``make_tile_delta``)."""
    LOG2E, POS_INF = constants.LOG2E, constants.POS_INF
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def load_rows(lse_r, D_r, lse, delta, b, h, row_g, seqlen_q):
        for half in range(2):
            lse_r[half] = POS_INF  # past the queries: P = 0
            D_r[half] = ZERO
            if row_g + 8 * half < seqlen_q:
                lse_r[half] = lse[b, h, row_g + 8 * half] * LOG2E
                if WITH_DELTA:
                    D_r[half] = delta[b, h, row_g + 8 * half]

    return load_rows


def make_tile_delta(DPAD, BLOCK_M, FMT):
    """``tile_delta(D_r, words, o_tile, do_tile, r, t, scratch, tid)``: the preprocess in a dQ
    kernel. D_i = rowsum(dO_i * O_i) of tile rows ``r``, ``r + 8`` into D_r (2,), from BLOCK_M-row
    128-byte-swizzled O and dO tiles at 16-bit elements ``o_tile``, ``do_tile`` of dynamic shared
    memory read as its 32-bit ``words``. The quad's lanes ``t = 0..3`` share the rows (an mma
    fragment's): lane t sums the element pairs at columns ``2 t + 8 k``, two shuffles add the
    four sums. A warp's 32 words per k land in 32 banks (the swizzle spreads the 8 rows' chunk k
    over all 8 positions); padding columns are zero-filled by the copies and add nothing.
    ``scratch``: ``sync.scratch_size`` float32 (the simulator's)."""
    unpack = convert.unpack(FMT)
    tile_offset, shfl_xor = wgmma.tile_offset, sync.shfl_xor
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def tile_delta(D_r, words, o_tile, do_tile, r, t, scratch, tid):
        for half in range(2):
            acc = ZERO
            for k in range(DPAD // 8):
                at = tile_offset(r + 8 * half, 2 * t + 8 * k, BLOCK_M)
                o0, o1 = unpack(words[(o_tile + at) >> 1])
                d0, d1 = unpack(words[(do_tile + at) >> 1])
                acc += o0 * d0 + o1 * d1
            acc += shfl_xor(acc, 1, scratch, tid)
            acc += shfl_xor(acc, 2, scratch, tid)
            D_r[half] = acc

    return tile_delta


def make_dq_scores_to_ds(NT, BLOCK_N, CAUSAL, BLOCK_M=0, WINDOW=False, SOFTCAP=False,
                         ALIBI=False):
    """``scores_to_ds(S, dP, lse_r, D_r, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
    scale_log2, mods)``: dP (NT, 4), the C fragments of dP = dO_i V_j^T, becomes dS
    = P (dP - D_i) with P = exp2(S scale_log2 - lse_i log2 e) from S (NT, 4), masked past the
    keys, (causal) above the diagonal and (``WINDOW``) before a row's window start ``row +
    diag_lo`` where the key tile ``n0`` crosses them. Element (nt, e): query row_g + 8 (e >>
    1), key n0 + t2 + 8 nt + (e & 1). S is left as it was. ``SOFTCAP``, ``ALIBI``: P from the
    score the forward's softmax saw and dS times its derivative (the cap's ``1 - tanh^2``), by
    ``score_mods.make_score_mods`` with the caller's ``mods``."""
    exp2 = convert.exp2_approx
    needs_mask = make_needs_mask(BLOCK_N, CAUSAL)
    masked_out = make_mask(CAUSAL)
    crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)[2]
    modified = make_score_mods(False, SOFTCAP, ALIBI)[1]
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def scores_to_ds(S, dP, lse_r, D_r, n0, m0, row_g, t2, seqlen_k, diag, diag_lo, scale_log2,
                     mods):
        masked = needs_mask(n0, m0, diag, seqlen_k) or crosses_begin(n0, m0, diag_lo)
        for nt in range(NT):
            for e in range(4):
                half = e >> 1
                key = n0 + t2 + 8 * nt + (e & 1)
                row = row_g + 8 * half
                s, slope = modified(S[nt, e], mods, mods[3] + float32(row - key))
                p = exp2(s * scale_log2 - lse_r[half])
                if masked and (masked_out(row, key, diag, seqlen_k) or
                               (WINDOW and key < row + diag_lo)):
                    p = ZERO
                dP[nt, e] = p * (dP[nt, e] - D_r[half]) * slope

    return scores_to_ds


def make_dkdv_rows(BLOCK_M, THREADS):
    """``stage_rows(words, rows, lse, delta, b, h, m0, seqlen_q, tid)``: lse_i log2 e and D_i of
    the query tile ``m0 .. m0 + BLOCK_M - 1`` into float32 words ``rows ..`` and ``rows +
    BLOCK_M ..`` of shared memory, +inf and 0 past the queries (P = 0 there), the CTA's THREADS
    threads striding over the rows. The caller's barrier publishes them."""
    LOG2E, POS_INF = constants.LOG2E, constants.POS_INF
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def stage_rows(words, rows, lse, delta, b, h, m0, seqlen_q, tid):
        for r in range(tid, BLOCK_M, THREADS):
            lse_r, D_r = POS_INF, ZERO
            if m0 + r < seqlen_q:
                lse_r = lse[b, h, m0 + r] * LOG2E
                D_r = delta[b, h, m0 + r]
            words[rows + r] = lse_r
            words[rows + BLOCK_M + r] = D_r

    return stage_rows


def make_dkdv_scores_to_ds(MT, BLOCK_M, BLOCK_N, CAUSAL, WINDOW=False, SOFTCAP=False,
                           ALIBI=False):
    """``scores_to_ds(S, dP, words, rows, m0, n0, key_g, t2, diag, diag_lo, scale_log2,
    mods)``: the transposed step. S (MT, 4) holds S^T = K_j Q_i^T and becomes P^T = exp2(S^T scale_log2 - lse_i log2 e);
    dP (MT, 4) holds dP^T = V_j dO_i^T and becomes dS^T = P^T (dP^T - D_i), with lse_i log2 e
    and D_i read from ``make_dkdv_rows``' words at ``rows``. Element (mt, e): key key_g + 8 (e
    >> 1), query m0 + t2 + 8 mt + (e & 1). Only the causal diagonal and (``WINDOW``) the
    window's start are masked: queries past the end have P = 0 from their +inf lse, and keys
    past the end are never stored. ``SOFTCAP``, ``ALIBI`` as in ``make_dq_scores_to_ds``."""
    exp2 = convert.exp2_approx
    masked_out = make_mask(CAUSAL, KEYS_IN_RANGE=True)
    crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)[2]
    modified = make_score_mods(False, SOFTCAP, ALIBI)[1]
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def scores_to_ds(S, dP, words, rows, m0, n0, key_g, t2, diag, diag_lo, scale_log2, mods):
        masked = (CAUSAL and m0 + diag < n0 + BLOCK_N - 1) or crosses_begin(n0, m0, diag_lo)
        for mt in range(MT):
            for e in range(4):
                col = t2 + 8 * mt + (e & 1)
                key = key_g + 8 * (e >> 1)
                s, slope = modified(S[mt, e], mods, mods[3] + float32(m0 + col - key))
                p = exp2(s * scale_log2 - words[rows + col])
                if masked and (masked_out(m0 + col, key, diag, 0) or
                               (WINDOW and key < m0 + col + diag_lo)):
                    p = ZERO
                S[mt, e] = p
                dP[mt, e] = p * (dP[mt, e] - words[rows + BLOCK_M + col]) * slope

    return scores_to_ds
