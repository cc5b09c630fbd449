"""kernels/common/masks.py against the bottom-right causal rule written out in NumPy: a batch
entry's bounds, which keys a query row sees, where a query tile's keys end, and which key tiles
need a mask at all."""

import numpy as np
import pytest
from numba import cuda

from numba_flash.kernels.common.masks import (make_kv_end, make_mask, make_needs_mask, make_q_begin,
                                              make_row_end, make_seqlen_info)
from numba_flash.kernels.common.status import BAD_SEQLENS

BLOCK_M, BLOCK_N = 16, 8


def make_probe(causal):
    kv_end, needs_mask = make_kv_end(BLOCK_M, causal), make_needs_mask(BLOCK_N, causal)

    @cuda.jit
    def probe(seqlen_q, seqlen_k, ends, masks):
        """ends[t] = kv_end of query tile t; masks[t, j] = needs_mask of key tile j under it."""
        t, j = cuda.blockIdx.x, cuda.threadIdx.x
        diag = seqlen_k - seqlen_q
        m0 = t * BLOCK_M
        if j == 0:
            ends[t] = kv_end(m0, diag, seqlen_k)
        masks[t, j] = needs_mask(j * BLOCK_N, m0, diag, seqlen_k)

    return probe


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(40, 40), (17, 45), (45, 17), (1, 30)])
def test_tile_limits_follow_the_bottom_right_mask(causal, seqlen_q, seqlen_k):
    q_tiles, k_tiles = -(-seqlen_q // BLOCK_M), -(-seqlen_k // BLOCK_N)
    ends = np.full(q_tiles, -1, np.int64)
    masks = np.full((q_tiles, k_tiles), 7, np.int64)
    make_probe(causal)[q_tiles, k_tiles](seqlen_q, seqlen_k, ends, masks)

    rows, cols = np.arange(q_tiles * BLOCK_M)[:, None], np.arange(k_tiles * BLOCK_N)[None, :]
    visible = (cols < seqlen_k) & ((cols <= rows + seqlen_k - seqlen_q) if causal else True)
    for t in range(q_tiles):
        tile = visible[t * BLOCK_M:(t + 1) * BLOCK_M]
        seen = np.flatnonzero(tile.any(axis=0))
        # every visible key lies before kv_end, and kv_end never passes the keys
        assert ends[t] <= seqlen_k and (seen.size == 0 or seen[-1] < ends[t])
        for j in range(k_tiles):
            block = tile[:, j * BLOCK_N:(j + 1) * BLOCK_N]
            if not masks[t, j]:  # unmasked tiles must be fully visible to the tile's rows
                assert block.all(), (t, j)
            assert masks[t, j] in (0, 1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(40, 50), (50, 20)])
def test_kv_end_is_one_past_the_last_key_the_tile_sees(causal, seqlen_q, seqlen_k):
    q_tiles = -(-seqlen_q // BLOCK_M)
    ends = np.full(q_tiles, -1, np.int64)
    make_probe(causal)[q_tiles, 1](seqlen_q, seqlen_k, ends, np.zeros((q_tiles, 1), np.int64))
    diag = seqlen_k - seqlen_q  # query r sees keys j <= r + diag
    for t, m0 in enumerate(range(0, seqlen_q, BLOCK_M)):
        seen = [j for r in range(m0, m0 + BLOCK_M) for j in range(seqlen_k)
                if not causal or j <= r + diag]
        assert max(ends[t], 0) == (max(seen) + 1 if seen else 0), m0  # <= 0: no key tile


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(40, 40), (17, 45), (45, 17), (30, 1)])
def test_q_begin_is_the_tile_of_the_first_row_that_sees_the_keys(causal, seqlen_q, seqlen_k):
    q_begin = make_q_begin(BLOCK_M, causal)

    @cuda.jit
    def probe(seqlen_q, seqlen_k, begins):
        j = cuda.threadIdx.x
        begins[j] = q_begin(j * BLOCK_N, seqlen_k - seqlen_q)

    k_tiles = -(-seqlen_k // BLOCK_N)
    begins = np.full(k_tiles, -1, np.int64)
    probe[1, k_tiles](seqlen_q, seqlen_k, begins)
    rows, cols = np.arange(seqlen_q)[:, None], np.arange(seqlen_k)[None, :]
    visible = (cols <= rows + seqlen_k - seqlen_q) if causal else np.ones_like(rows & cols, bool)
    for j in range(k_tiles):
        first = np.flatnonzero(visible[:, j * BLOCK_N:].any(axis=1))[0]  # the last row sees all
        # no row before q_begin sees a key of the tile (or later), and its tile holds the first
        assert begins[j] % BLOCK_M == 0 and begins[j] <= first < begins[j] + BLOCK_M, j


def probe_seqlen_info(varlen, seqlen_q, seqlen_k, total_q, total_k, cu_q, cu_k, used,
                      paged=False):
    """Each batch entry's (q0, k0, Sq, Sk, diag) from make_seqlen_info, and the status word."""
    seqlen_info = make_seqlen_info(varlen, paged)

    @cuda.jit
    def probe(seqlen_q, seqlen_k, total_q, total_k, cu_q, cu_k, used, status, got):
        b = cuda.threadIdx.x
        got[b, 0], got[b, 1], got[b, 2], got[b, 3], got[b, 4] = seqlen_info(
            b, seqlen_q, seqlen_k, total_q, total_k, cu_q, cu_k, used, status)

    batch = len(cu_q) - 1
    got, status = np.full((batch, 5), -7, np.int64), np.zeros(1, np.int32)
    probe[1, batch](seqlen_q, seqlen_k, total_q, total_k, np.asarray(cu_q, np.int32),
                    np.asarray(cu_k, np.int32), np.asarray(used, np.int32), status, got)
    return got, status[0]


def test_seqlen_info_of_a_dense_batch_gives_the_lengths_and_the_causal_offset():
    got, status = probe_seqlen_info(False, 17, 45, 17, 45, [7, 7, 7], [7, 7, 7], [])
    # every entry starts at row 0 of its batch slice, with the kernel's lengths; nothing read
    assert (got == [0, 0, 17, 45, 28]).all() and status == 0


def test_seqlen_info_of_packed_sequences_reads_their_offsets_and_seqused_k():
    cu_q, cu_k = [0, 3, 3, 8], [0, 4, 6, 9]
    got, status = probe_seqlen_info(True, 5, 4, 8, 9, cu_q, cu_k, [])
    assert got.tolist() == [[0, 0, 3, 4, 1], [3, 4, 0, 2, 2], [3, 6, 5, 3, -2]] and status == 0
    got, status = probe_seqlen_info(True, 5, 4, 8, 9, cu_q, cu_k, [2, 0, 3])
    assert got[:, 3].tolist() == [2, 0, 3] and status == 0


@pytest.mark.parametrize("cu_q, cu_k, used, want", [
    ([0, 6, 2], [0, 2, 4], [], [[0, 0, 5, 2, -3], [6, 2, 0, 2, 2]]),     # decreasing, over max
    ([-3, 2, 9], [0, 2, 40], [], [[0, 0, 2, 2, 0], [2, 2, 5, 4, -1]]),   # outside the arrays
    ([0, 2, 4], [0, 2, 4], [3, -1], [[0, 0, 2, 2, 0], [2, 2, 2, 0, -2]]),  # seqused_k outside
])
def test_seqlen_info_clamps_offsets_into_the_arrays_and_bounds_and_reports(cu_q, cu_k, used,
                                                                           want):
    got, status = probe_seqlen_info(True, 5, 4, 7, 6, cu_q, cu_k, used)
    assert got.tolist() == want and status == BAD_SEQLENS


def test_seqlen_info_of_paged_keys_counts_them_from_the_first_page():
    """Paged K/V: every sequence's keys start at key 0 of its table row; cu_seqlens_k gives
    only their number, bounded by max_seqlen_k and the table's capacity (total_k)."""
    cu_q, cu_k = [0, 3, 3, 8], [0, 4, 6, 9]
    got, status = probe_seqlen_info(True, 5, 4, 8, 8, cu_q, cu_k, [], paged=True)
    assert got.tolist() == [[0, 0, 3, 4, 1], [3, 0, 0, 2, 2], [3, 0, 5, 3, -2]] and status == 0
    got, status = probe_seqlen_info(True, 5, 9, 8, 6, cu_q, [5, 14, 12, 13], [], paged=True)
    assert got[:, 3].tolist() == [6, 0, 1] and status == BAD_SEQLENS  # past the table, negative


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(20, 20), (9, 23), (23, 9)])
def test_mask_and_row_end_hide_keys_past_the_end_and_above_the_diagonal(causal, seqlen_q,
                                                                        seqlen_k):
    masked_out, in_range = make_mask(causal), make_mask(causal, KEYS_IN_RANGE=True)
    row_end = make_row_end(causal)

    @cuda.jit
    def probe(seqlen_q, seqlen_k, hidden, diagonal_only, ends):
        r, j = cuda.blockIdx.x, cuda.threadIdx.x
        diag = seqlen_k - seqlen_q
        hidden[r, j] = masked_out(r, j, diag, seqlen_k)
        diagonal_only[r, j] = in_range(r, j, diag, seqlen_k)
        if j == 0:
            ends[r] = row_end(r, diag, seqlen_k)

    rows, cols = seqlen_q, seqlen_k + 5  # keys past the end too
    hidden = np.full((rows, cols), 7, np.int64)
    diagonal_only = np.full((rows, cols), 7, np.int64)
    ends = np.full(rows, -7, np.int64)
    probe[rows, cols](seqlen_q, seqlen_k, hidden, diagonal_only, ends)
    for r in range(rows):
        for j in range(cols):
            above = causal and j > r + seqlen_k - seqlen_q
            sees = j < seqlen_k and not above
            assert hidden[r, j] == (not sees), (r, j)
            assert diagonal_only[r, j] == above, (r, j)  # keys past the end are the caller's
        # the row's visible keys are exactly those before its end (none when it is <= 0)
        assert (np.arange(cols) < ends[r]).tolist() == [not h for h in hidden[r]], r
