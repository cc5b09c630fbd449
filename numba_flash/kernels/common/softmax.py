"""The online softmax of the tensor-core kernels, on the registers of mma C fragments.

For each key tile j a query row i keeps a running maximum m_i, a running sum l_i of
``exp(scale (s - m_i))`` and an unnormalised output O_i; a new tile of scores S_ij moves them by

    m_new = max(m_i, rowmax(S_ij))
    P_ij  = exp(scale (S_ij - m_new))
    l_i   = exp(scale (m_i - m_new)) l_i + rowsum(P_ij)
    O_i   = exp(scale (m_i - m_new)) O_i + P_ij V_j        (the caller's product)

and after the last tile O_i / l_i is the softmax-weighted sum and ``lse_i = scale m_i + log
l_i`` (common/epilogue.py). ``make_softmax_step`` does the mask and the first three lines for
one thread's fragments, with one refinement: m_i moves only when a row maximum exceeds it by
more than RESCALE_LOG2 in base-2 units (a factor 256 in P). Any m_i is exact as long as O_i and
l_i share it; a stale one lets P grow to at most 2^8, harmless in float32 and in 16-bit P, and
the rescale of O_i (HEAD_DIM / 4 multiplies per row) then runs on a few early tiles only.
Both tc forwards (``tc/forward_mma.py``, ``tc/forward_wgmma.py``) use it; the tc decode
(``tc/mla_decode_wgmma.py``), whose two warpgroups share each row, uses its two halves
(``make_row_max``, ``make_online_update``) with an exchange of the maxima between them; the
seesaw decode (``tc/mla_decode_seesaw.py``), whose warpgroups take turns on a row's maximum, the
same lazy rule as ``make_moving_max``.
"""

from numba import cuda, float32

from ..instructions import convert, sync
from . import constants
from .masks import make_needs_mask, make_row_end, make_window
from .score_mods import make_score_mods

RESCALE_LOG2 = 8.0  # growth of a row maximum (base 2) that moves m_i: P stays below 2^8


def make_row_max(MT, NT):
    """``row_max(S, m_tile, shfl_scratch, tid)``: the maximum of each of the thread's rows over
    the tile, shared by the quad (4 lanes) that holds the row, into m_tile (MT, 2)."""
    shfl_xor = sync.shfl_xor

    @cuda.jit(device=True, inline="always")
    def row_max(S, m_tile, shfl_scratch, tid):
        # All rows together: their quad shuffles are independent, so their latencies overlap.
        for mt in range(MT):
            for half in range(2):
                mx = max(S[mt, 0, 2 * half], S[mt, 0, 2 * half + 1])
                for nt in range(1, NT):
                    mx = max(mx, max(S[mt, nt, 2 * half], S[mt, nt, 2 * half + 1]))
                m_tile[mt, half] = mx
        for mask in (1, 2):
            for mt in range(MT):
                for half in range(2):
                    mx = m_tile[mt, half]
                    m_tile[mt, half] = max(mx, shfl_xor(mx, mask, shfl_scratch, tid))

    return row_max


def make_online_update(MT, NT, DT, RESCALE_AT=RESCALE_LOG2):
    """``update(S, m_i, l_i, O_i, m_tile, scale_log2)``: given the tile's row maxima m_tile,
    move m_i (lazily: past RESCALE_AT in base 2; 0 moves it with every new maximum, so P <= 1),
    rescale l_i and O_i, turn S into P and add its row sums to l_i (the thread's columns only:
    the quad's partial sums are added up once, in the epilogue)."""
    exp2 = convert.exp2_approx  # ex2.approx.ftz: no special-case selects around it
    NEG_INF = constants.NEG_INF
    ZERO = float32(0.0)
    RESCALE = float32(RESCALE_AT)

    @cuda.jit(device=True, inline="always")
    def update(S, m_i, l_i, O_i, m_tile, scale_log2):
        # m_i is kept in raw score units (the scale is positive, so maxima commute with it) and
        # the scale rides in each exponent: exp(scale (s - m)) = exp2(s * scale_log2 - m *
        # scale_log2), one FFMA and one ex2 per element. Lazy rescaling: m_i only moves when
        # the row maximum has grown by more than RESCALE_LOG2 (base 2); one branch covers the
        # rescale of all the thread's rows.
        grow = False
        for mt in range(MT):
            for half in range(2):  # false while both are -inf
                grow |= (m_tile[mt, half] - m_i[mt, half]) * scale_log2 > RESCALE
        if grow:
            for mt in range(MT):
                for half in range(2):
                    m_old, mx = m_i[mt, half], m_tile[mt, half]
                    if (mx - m_old) * scale_log2 > RESCALE:
                        alpha = exp2((m_old - mx) * scale_log2)
                        m_i[mt, half] = mx
                        l_i[mt, half] *= alpha
                        for dt in range(DT):
                            O_i[mt, dt, 2 * half] *= alpha
                            O_i[mt, dt, 2 * half + 1] *= alpha
        for mt in range(MT):
            for half in range(2):
                m = m_i[mt, half]
                base = m * scale_log2 if m != NEG_INF else ZERO  # nothing visible yet
                row_sum = ZERO
                for nt in range(NT):
                    for e in range(2 * half, 2 * half + 2):
                        p = exp2(S[mt, nt, e] * scale_log2 - base)
                        S[mt, nt, e] = p
                        row_sum += p
                l_i[mt, half] += row_sum

    return update


def make_score_mask(MT, NT, BLOCK_N, CAUSAL, BLOCK_M=0, WINDOW=False, SOFTCAP=False,
                    ALIBI=False):
    """``mask_scores(S, n0, m0, row_g, t2, seqlen_k, diag, diag_lo, mods)``, the first half of
    the per-tile step: S (MT, NT, 4), the thread's C fragments of S_ij (rows ``row_g + 16 mt``
    and ``+ 8``, columns ``t2, t2 + 1`` of each 8-column tile), becomes the score the softmax
    sees (``SOFTCAP``, ``ALIBI``: ``score_mods.make_score_mods``, whose ``mods`` the caller made
    for raw scores), masked to -inf where the tile crosses the ragged end, the causal diagonal
    or (``WINDOW``) a row's first key (``j < row + diag_lo``, ``masks.make_window``)."""
    NEG_INF = constants.NEG_INF
    needs_mask = make_needs_mask(BLOCK_N, CAUSAL)
    crosses_begin = make_window(BLOCK_M, BLOCK_N, WINDOW)[2]
    row_end = make_row_end(CAUSAL)
    modified = make_score_mods(False, SOFTCAP, ALIBI)[1]

    @cuda.jit(device=True, inline="always")
    def mask_scores(S, n0, m0, row_g, t2, seqlen_k, diag, diag_lo, mods):
        if SOFTCAP or ALIBI:
            for mt in range(MT):
                for half in range(2):
                    # i + diag - j of the thread's first column; each column's is a constant
                    # away from it.
                    rel = mods[3] + float32(row_g + 16 * mt + 8 * half - n0 - t2)
                    for nt in range(NT):
                        for e in range(2 * half, 2 * half + 2):
                            S[mt, nt, e] = modified(S[mt, nt, e], mods,
                                                    rel - float32(8 * nt + (e & 1)))[0]
        # Only a tile that crosses the ragged end, the diagonal or (window) a row's first key.
        if needs_mask(n0, m0, diag, seqlen_k) or crosses_begin(n0, m0, diag_lo):
            # Element (mt, nt, e) has column n0 + t2 + 8 nt + (e & 1) and row row_g + 16 mt +
            # 8 (e >> 1). Relative to the thread's first column, a row's end of visible keys
            # is one limit, and each test is a compare of that limit with a constant.
            for mt in range(MT):
                for half in range(2):
                    row = row_g + 16 * mt + 8 * half
                    limit = row_end(row, diag, seqlen_k) - (n0 + t2)
                    begin = row + diag_lo - (n0 + t2)
                    for nt in range(NT):
                        for e in range(2 * half, 2 * half + 2):
                            col = 8 * nt + (e & 1)
                            if col >= limit or (WINDOW and col < begin):
                                S[mt, nt, e] = NEG_INF

    return mask_scores


def make_softmax_step(MT, NT, DT, BLOCK_N, CAUSAL, BLOCK_M=0, WINDOW=False, SOFTCAP=False,
                      ALIBI=False, RESCALE_AT=RESCALE_LOG2):
    """The per-tile step the tc forwards share, as an inline device function: the scores of
    S_ij modified and masked (``make_score_mask``), then the online softmax with lazy
    rescaling (``make_row_max``, ``make_online_update`` with RESCALE_AT). S (MT, NT, 4) leaves
    holding P_ij (float32); m_i, l_i, m_tile (MT, 2) and O_i (MT, DT, 4) follow the C-fragment
    row ownership of ``make_score_mask``."""
    mask_scores = make_score_mask(MT, NT, BLOCK_N, CAUSAL, BLOCK_M, WINDOW, SOFTCAP, ALIBI)
    row_max = make_row_max(MT, NT)
    update = make_online_update(MT, NT, DT, RESCALE_AT)

    @cuda.jit(device=True, inline="always")
    def softmax_step(S, m_i, l_i, O_i, m_tile, n0, m0, row_g, t2, seqlen_k, diag, diag_lo,
                     scale_log2, mods, shfl_scratch, tid):
        mask_scores(S, n0, m0, row_g, t2, seqlen_k, diag, diag_lo, mods)
        row_max(S, m_tile, shfl_scratch, tid)
        update(S, m_i, l_i, O_i, m_tile, scale_log2)

    return softmax_step


def make_moving_max(NT, DT):
    """The lazy rescale of ``make_online_update`` cut at the point where two warpgroups that
    share a row hand its maximum to each other (``tc/mla_decode_seesaw.py``): the new maximum
    and its factor are computed by one, applied by both. For one thread's two C-fragment rows,
    S (1, NT, 4), O_i (1, DT, 4), l_i, the maxima and the factors (2,):

        moved_max(m_old, m_tile, scale_log2) -> (m_new, factor)   one row, lazily (RESCALE_LOG2)
        rescale(O_i, l_i, factor)           O_i and l_i times their rows' factors
        rescale_out(O_i, factor)            O_i alone (a kernel whose product on O_i is still
                                            in flight when l_i moves)
        exponentiate(S, m_new, l_i, scale_log2)   S -> P at m_new, its row sums into l_i
    """
    exp2 = convert.exp2_approx
    NEG_INF = constants.NEG_INF
    ZERO, ONE = float32(0.0), float32(1.0)
    RESCALE = float32(RESCALE_LOG2)

    @cuda.jit(device=True, inline="always")
    def moved_max(m_old, m_tile, scale_log2):
        """The row's maximum moves only when the tile's exceeds it by more than RESCALE_LOG2
        (base 2), so P stays below 2^8; else the factor is 1."""
        if (m_tile - m_old) * scale_log2 > RESCALE:  # false while both are -inf
            return m_tile, exp2((m_old - m_tile) * scale_log2)
        return m_old, ONE

    def make_rescale(WITH_L):
        @cuda.jit(device=True, inline="always")
        def rescale(O_i, l_i, factor):
            """Skipped where both factors are 1: the maxima move lazily, so after the first
            tiles they seldom do."""
            if factor[0] != ONE or factor[1] != ONE:
                for half in range(2):
                    sc = factor[half]
                    if WITH_L:
                        l_i[half] *= sc
                    for dt in range(DT):
                        O_i[0, dt, 2 * half] *= sc
                        O_i[0, dt, 2 * half + 1] *= sc

        return rescale

    rescale = make_rescale(True)
    rescale_o = make_rescale(False)

    @cuda.jit(device=True, inline="always")
    def rescale_out(O_i, factor):
        rescale_o(O_i, factor, factor)  # O_i alone: its l_i argument is never read

    @cuda.jit(device=True, inline="always")
    def exponentiate(S, m_new, l_i, scale_log2):
        """P = exp2(S scale_log2 - m_new scale_log2), as ``make_online_update`` computes it."""
        for half in range(2):
            m = m_new[half]
            base = m * scale_log2 if m != NEG_INF else ZERO  # nothing visible yet
            row_sum = ZERO
            for nt in range(NT):
                for e in range(2 * half, 2 * half + 2):
                    p = exp2(S[0, nt, e] * scale_log2 - base)
                    S[0, nt, e] = p
                    row_sum += p
            l_i[half] += row_sum

    return moved_max, rescale, exponentiate, rescale_out
