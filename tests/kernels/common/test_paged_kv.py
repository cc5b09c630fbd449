"""kernels/common/paged_kv.py's row key windows (``make_row_keys``) against the decode's rules
written out in NumPy: packed query row r is token r // group of s_q, it sees the piece's keys
below n_hi and, causal, those below seqlen - (s_q - 1 - token)."""

import numpy as np
import pytest
from numba import cuda, float32, int32

from numba_flash.kernels.common.paged_kv import make_row_keys

NT, DT = 3, 2  # 24 keys per tile, 16 O columns


def make_probe(causal):
    start_rows, mask_keys = make_row_keys(causal, NT, DT)

    @cuda.jit
    def probe(n_hi, seqlen, s_q, group, key0, S, state):
        """Thread r holds rows r and r + 8; S[r] its fragments before and after the mask;
        state[r] = (limits, m_i, l_i, O_i) after start_rows (from poisoned values)."""
        r = cuda.threadIdx.x
        limit = cuda.local.array(2, int32)
        m_i = cuda.local.array((1, 2), float32)
        l_i = cuda.local.array((1, 2), float32)
        O_i = cuda.local.array((1, DT, 4), float32)
        frag = cuda.local.array((1, NT, 4), float32)
        for h in range(2):
            m_i[0, h] = 7.0
            l_i[0, h] = 7.0
        for dt in range(DT):
            for e in range(4):
                O_i[0, dt, e] = 7.0
        start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, r)
        for nt in range(NT):
            for e in range(4):
                frag[0, nt, e] = S[r, nt, e]
        mask_keys(frag, limit, key0)
        for nt in range(NT):
            for e in range(4):
                S[r, nt, e] = frag[0, nt, e]
        for h in range(2):
            state[r, h] = limit[h]
            state[r, 2 + h] = m_i[0, h]
            state[r, 4 + h] = l_i[0, h]
        for dt in range(DT):
            for e in range(4):
                state[r, 6 + 4 * dt + e] = O_i[0, dt, e]

    return probe


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hi, seqlen, key0", [(100, 100, 80), (64, 100, 40), (100, 100, 0)])
def test_rows_see_the_piece_and_their_diagonal(causal, n_hi, seqlen, key0, rng):
    s_q, group, rows = 4, 3, 8  # 16 packed rows: tokens 0 .. 3, three heads each (and padding)
    S = rng.standard_normal((rows, NT, 4)).astype(np.float32)
    state = np.full((rows, 6 + 4 * DT), np.nan, np.float32)
    got = S.copy()
    make_probe(causal)[1, rows](n_hi, seqlen, s_q, group, key0, got, state)
    for r in range(rows):
        for half in range(2):
            row = r + 8 * half
            want = n_hi
            if causal:
                want = min(want, seqlen - (s_q - 1 - row // group))
            assert state[r, half] == want
            for nt in range(NT):
                for e in (2 * half, 2 * half + 1):
                    key = key0 + 8 * nt + (e & 1)
                    assert got[r, nt, e] == (-np.inf if key >= want else S[r, nt, e])
    assert (state[:, 2:4] == -np.inf).all() and (state[:, 4:] == 0).all()
