"""kernels/common/backward.py against P = exp2(S scale_log2 - lse log2 e), dS = P (dP - D_i)
(with a sliding window's lower diagonal, with a softcap: P from ``cap_out tanh(S cap_in)``,
dS times ``1 - tanh^2``, and with ALiBi: the score minus ``slope |i + diag - j|``) written out in NumPy on whole tiles: one warp's C fragments (row ``g`` and ``g + 8``, columns
``t2, t2 + 1`` of each 8-column tile) are scattered back to matrices, so a wrong fragment
mapping, a missed mask or a query past the end with P != 0 shows up as a wrong element; and
the fused preprocess' D_i = rowsum(dO_i O_i) from swizzled tiles against a float64 sum."""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, uint32

from numba_flash.kernels.common import backward, constants
from numba_flash.kernels.instructions import sync

NT = 4  # 8-column tiles per fragment row: 32 columns, one warp's 16 rows
COLS = 8 * NT
STAGED = 2 * COLS  # floats of the lse_i log2 e and D_i rows the probe stages
SCALE_LOG2 = 0.37
CAP_IN, CAP_OUT = 0.25, 3.0  # a softcap in the kernels' units (common/score_mods.py)
ALIBI = 0.3  # an ALiBi slope in the same units
# (causal, left side of a window or None, softcap, alibi): the masks and modifiers the probes run
MODES = [(False, None, False, False), (True, None, False, False), (True, 9, False, False),
         (False, None, True, False), (True, 5, True, False), (False, None, False, True),
         (True, 5, True, True)]


def fragments_of(M):
    """(32, NT, 4) fragments of a 16 x COLS matrix: lane, 8-column tile, element."""
    F = np.empty((32, NT, 4), M.dtype)
    for lane in range(32):
        g, t2 = lane >> 2, (lane & 3) * 2
        for nt in range(NT):
            for e in range(4):
                F[lane, nt, e] = M[g + 8 * (e >> 1), t2 + 8 * nt + (e & 1)]
    return F


def matrix_of(F):
    M = np.empty((16, COLS), F.dtype)
    for lane in range(32):
        g, t2 = lane >> 2, (lane & 3) * 2
        for nt in range(NT):
            for e in range(4):
                M[g + 8 * (e >> 1), t2 + 8 * nt + (e & 1)] = F[lane, nt, e]
    return M


def make_dq_probe(causal, window, softcap, alibi):
    load_rows = backward.make_dq_rows()
    scores_to_ds = backward.make_dq_scores_to_ds(NT, COLS, causal or window, 16, window,
                                                 softcap, alibi)
    LEFT = window or 0

    @cuda.jit
    def probe(S_in, dP_in, lse, delta, m0, n0, seqlen_q, seqlen_k, dS_out):
        lane = cuda.threadIdx.x
        g, t2 = lane >> 2, (lane & 3) * 2
        S = cuda.local.array((NT, 4), float32)
        dP = cuda.local.array((NT, 4), float32)
        for nt in range(NT):
            for e in range(4):
                S[nt, e] = S_in[lane, nt, e]
                dP[nt, e] = dP_in[lane, nt, e]
        lse_r = cuda.local.array(2, float32)
        D_r = cuda.local.array(2, float32)
        row_g = m0 + g
        load_rows(lse_r, D_r, lse, delta, 0, 0, row_g, seqlen_q)
        diag = seqlen_k - seqlen_q
        mods = (float32(CAP_IN), float32(CAP_OUT), float32(ALIBI), float32(diag))
        scores_to_ds(S, dP, lse_r, D_r, n0, m0, row_g, t2, seqlen_k, diag, diag - LEFT,
                     float32(SCALE_LOG2), mods)
        for nt in range(NT):
            for e in range(4):
                dS_out[lane, nt, e] = dP[nt, e]

    return probe


def make_dkdv_probe(causal, window, softcap, alibi):
    stage_rows = backward.make_dkdv_rows(COLS, 32)
    scores_to_ds = backward.make_dkdv_scores_to_ds(NT, COLS, 16, causal or window, window,
                                                   softcap, alibi)
    LEFT = window or 0

    @cuda.jit
    def probe(S_in, dP_in, lse, delta, m0, n0, seqlen_q, seqlen_k, P_out, dS_out):
        lane = cuda.threadIdx.x
        g, t2 = lane >> 2, (lane & 3) * 2
        words = cuda.shared.array(STAGED, float32)
        S = cuda.local.array((NT, 4), float32)
        dP = cuda.local.array((NT, 4), float32)
        for nt in range(NT):
            for e in range(4):
                S[nt, e] = S_in[lane, nt, e]
                dP[nt, e] = dP_in[lane, nt, e]
        stage_rows(words, 0, lse, delta, 0, 0, m0, seqlen_q, lane)
        cuda.syncthreads()
        diag = seqlen_k - seqlen_q
        mods = (float32(CAP_IN), float32(CAP_OUT), float32(ALIBI), float32(diag))
        scores_to_ds(S, dP, words, 0, m0, n0, n0 + g, t2, diag, diag - LEFT,
                     float32(SCALE_LOG2), mods)
        for nt in range(NT):
            for e in range(4):
                P_out[lane, nt, e] = S[nt, e]
                dS_out[lane, nt, e] = dP[nt, e]

    return probe


def inputs(rng, seqlen_q, rows, cols):
    S = rng.standard_normal((rows, cols)).astype(np.float32) * 4
    dP = rng.standard_normal((rows, cols)).astype(np.float32)
    lse = np.zeros((1, 1, seqlen_q), np.float32)
    lse[0, 0] = rng.standard_normal(seqlen_q) + 2
    delta = np.zeros((1, 1, seqlen_q), np.float32)
    delta[0, 0] = rng.standard_normal(seqlen_q)
    return S, dP, lse, delta


def expected(S, dP, lse_q, D_q, queries, keys, seqlen_q, seqlen_k, causal, window, softcap,
             alibi):
    """P, the visible pairs, D and the cap's slope of S, dP laid out [query][key] for the given
    query and key indices (a window of ``window`` keys to the left, causal on the right)."""
    q, k = queries[:, None], keys[None, :]
    inside = q < seqlen_q
    lse2 = np.where(inside, lse_q[np.minimum(q, seqlen_q - 1)] * np.float32(constants.LOG2E),
                    np.inf).astype(np.float32)
    D = np.where(inside, D_q[np.minimum(q, seqlen_q - 1)], 0).astype(np.float32)
    slope = np.float32(1.0)
    if softcap:
        t = np.tanh(S.astype(np.float64) * CAP_IN)
        S, slope = (CAP_OUT * t).astype(np.float32), (1 - t * t).astype(np.float32)
    diag = seqlen_k - seqlen_q
    if alibi:
        S = (S - ALIBI * np.abs(q + diag - k)).astype(np.float32)
    P = np.exp2(S * np.float32(SCALE_LOG2) - lse2).astype(np.float32)
    visible = (k <= q + diag) if causal or window else np.ones_like(inside)
    if window is not None:
        visible = visible & (k >= q + diag - window)
    return P, visible, D, slope


@pytest.mark.parametrize("causal, window, softcap, alibi", MODES)
@pytest.mark.parametrize("seqlen_q, seqlen_k, m0, n0",
                         [(40, 40, 16, 0), (40, 40, 16, 16), (30, 50, 16, 32), (20, 12, 16, 0),
                          (40, 40, 0, 32)])
def test_dq_step_is_p_times_dp_minus_d_with_masks(rng, causal, window, softcap, alibi, seqlen_q,
                                                  seqlen_k, m0, n0):
    S, dP, lse, delta = inputs(rng, seqlen_q, 16, COLS)
    dS = np.full((32, NT, 4), np.nan, np.float32)
    make_dq_probe(causal, window, softcap, alibi)[1, 32](
        fragments_of(S), fragments_of(dP), lse, delta, m0, n0, seqlen_q, seqlen_k, dS)
    queries, keys = np.arange(m0, m0 + 16), np.arange(n0, n0 + COLS)
    P, visible, D, slope = expected(S, dP, lse[0, 0], delta[0, 0], queries, keys, seqlen_q,
                                    seqlen_k, causal, window, softcap, alibi)
    P = np.where(visible & (keys[None, :] < seqlen_k), P, 0)
    np.testing.assert_allclose(matrix_of(dS), P * (dP - D) * slope, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal, window, softcap, alibi", MODES)
@pytest.mark.parametrize("seqlen_q, seqlen_k, m0, n0",
                         [(40, 40, 0, 16), (40, 40, 16, 16), (50, 30, 32, 0), (20, 44, 0, 16),
                          (40, 40, 32, 0)])
def test_dkdv_step_is_the_transposed_step(rng, causal, window, softcap, alibi, seqlen_q,
                                          seqlen_k, m0, n0):
    S_t, dP_t, lse, delta = inputs(rng, seqlen_q, 16, COLS)  # keys x queries
    P_out = np.full((32, NT, 4), np.nan, np.float32)
    dS_out = np.full((32, NT, 4), np.nan, np.float32)
    make_dkdv_probe(causal, window, softcap, alibi)[1, 32](
        fragments_of(S_t), fragments_of(dP_t), lse, delta, m0, n0, seqlen_q, seqlen_k, P_out,
        dS_out)
    queries, keys = np.arange(m0, m0 + COLS), np.arange(n0, n0 + 16)
    P, visible, D, slope = expected(S_t.T, dP_t.T, lse[0, 0], delta[0, 0], queries, keys,
                                    seqlen_q, seqlen_k, causal, window, softcap, alibi)
    P = np.where(visible, P, 0)  # no ragged-key mask here: those rows are never stored
    np.testing.assert_allclose(matrix_of(P_out), P.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(matrix_of(dS_out), (P * (dP_t.T - D) * slope).T, rtol=1e-5,
                               atol=1e-6)


# ----------------------------------------------------------------------------- fused D_i

TILE_ROWS, DPAD = 16, 128  # one warp's fragment rows, two 64-column blocks
IMAGE_WORDS = TILE_ROWS * DPAD  # the O tile's words, then dO's


def swizzled_image(M):
    """M (TILE_ROWS, DPAD) of 16-bit bits in the 128-byte-swizzle layout, written out here from
    the PTX ISA's description: 64-column blocks one after another, 128-byte rows, 16-byte chunk
    c of row r at chunk position c ^ (r & 7)."""
    img = np.zeros(TILE_ROWS * DPAD, np.uint16)
    for r in range(TILE_ROWS):
        for col in range(DPAD):
            chunk = ((col >> 3) & 7) ^ (r & 7)
            img[(col >> 6) * TILE_ROWS * 64 + r * 64 + chunk * 8 + (col & 7)] = M[r, col]
    return img


def make_delta_probe(fmt):
    tile_delta = backward.make_tile_delta(DPAD, TILE_ROWS, fmt)
    SHFL = sync.scratch_size(32)

    @cuda.jit
    def probe(image, D_out):
        words = cuda.shared.array(IMAGE_WORDS, uint32)
        scratch = cuda.shared.array(SHFL, float32)
        lane = cuda.threadIdx.x
        for i in range(lane, IMAGE_WORDS, 32):
            words[i] = image[i]
        cuda.syncthreads()
        D_r = cuda.local.array(2, float32)
        tile_delta(D_r, words, 0, TILE_ROWS * DPAD, lane >> 2, lane & 3, scratch, lane)
        for half in range(2):
            D_out[lane, half] = D_r[half]

    return probe


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_tile_delta_is_the_rowsum_of_do_times_o(rng, fmt):
    head_dim = 72  # the padding columns 72..127 are zeros, as the copies leave them
    dtype = np.float16 if fmt == "float16" else ml_dtypes.bfloat16
    O, dO = (np.zeros((TILE_ROWS, DPAD), dtype) for _ in range(2))
    O[:, :head_dim] = rng.standard_normal((TILE_ROWS, head_dim)).astype(dtype)
    dO[:, :head_dim] = rng.standard_normal((TILE_ROWS, head_dim)).astype(dtype)
    image = np.concatenate([swizzled_image(O.view(np.uint16)),
                            swizzled_image(dO.view(np.uint16))]).view(np.uint32)
    D_out = np.full((32, 2), np.nan, np.float32)
    make_delta_probe(fmt)[1, 32](image, D_out)
    want = (O.astype(np.float64) * dO.astype(np.float64)).sum(axis=1)
    g = np.arange(32) >> 2  # every lane of a quad holds its rows' sums
    np.testing.assert_allclose(D_out[:, 0], want[g], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(D_out[:, 1], want[g + 8], rtol=1e-5, atol=1e-5)
