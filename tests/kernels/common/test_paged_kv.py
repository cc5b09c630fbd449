"""kernels/common/paged_kv.py: the row key windows (``make_row_keys``) against the decode's rules
written out in NumPy (packed query row r is token r // group of s_q, it sees the piece's keys
below n_hi and, causal, those below seqlen - (s_q - 1 - token)); the pieces of a plan
(``piece_of``) against ``scheduler.part_pieces``; the staged output of a piece
(``make_piece_out``) against the rows its fragments hold; the block-table lookup
(``make_page_lookup``) against a table with bad entries; where a key lives (``make_key_row``),
in rows and in pages."""

import numpy as np
import pytest
from numba import cuda, float32, int32, uint16, uint32

from numba_flash import scheduler
from numba_flash.kernels.common.paged_kv import (make_key_row, make_page_lookup,
                                                 make_paged_kv_walk, make_piece_out,
                                                 make_row_keys)
from numba_flash.kernels.common.status import (BAD_SPLITS, BAD_TABLE_ENTRY, NEGATIVE_LENGTH,
                                               PAST_TABLE)

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


# ----------------------------------------------------------------------------- piece_of

@pytest.fixture(scope="module")
def pieces_probe():
    cta_work, piece_of, *_ = make_paged_kv_walk(32, 1, 1, "float16", False)

    @cuda.jit
    def probe(metadata, cache_seqlens, num_splits, pieces, status):
        """One thread per part: pieces[part, k] = (req, n_lo, n_hi, seqlen, split, slot) of
        its k-th piece."""
        part, _, _, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits, part,
                                                       req, begin_req, end_req, status)
            k = req - begin_req
            pieces[part, k, 0] = req
            pieces[part, k, 1] = n_lo
            pieces[part, k, 2] = n_hi
            pieces[part, k, 3] = seqlen
            pieces[part, k, 4] = split
            pieces[part, k, 5] = slot

    return probe


@pytest.mark.parametrize("seqlens", [[700, 0, 70, 1], [700, -7, 70, 1], [-1, -200, 70, -64]],
                         ids=["valid", "one-negative", "negatives"])
def test_pieces_are_the_plans_and_a_negative_length_is_reported(pieces_probe, seqlens):
    """Every decode reads the lengths in piece_of: the pieces are scheduler.part_pieces' for the
    lengths read as 0 (the planner's reading; a request cut over parts included), a negative
    length's piece holds no key, and it sets NEGATIVE_LENGTH; valid lengths set nothing."""
    seqlens = np.array(seqlens, np.int32)
    zeroed = np.maximum(seqlens, 0)
    metadata, num_splits = scheduler.plan_mla(zeroed, 1, 1, 4)
    assert (np.diff(num_splits) > 1).any() == (zeroed[0] > 0)
    parts, b = metadata.shape[0], len(seqlens)
    d_pieces = cuda.to_device(np.full((parts, b, 6), -99, np.int64))
    d_status = cuda.to_device(np.zeros(1, np.int32))
    pieces_probe[parts, 1](cuda.to_device(metadata), cuda.to_device(seqlens),
                           cuda.to_device(num_splits), d_pieces, d_status)
    got = d_pieces.copy_to_host()
    for part in range(parts):
        want = scheduler.part_pieces(metadata[part], zeroed, num_splits)
        assert (got[part, len(want):] == -99).all()
        for k, (req, blk_lo, blk_hi, slot, split) in enumerate(want):
            req_, n_lo, n_hi, seqlen, split_, slot_ = got[part, k]
            assert (req_, n_lo, seqlen, split_) == (req, 64 * blk_lo, seqlens[req], split)
            if split:
                assert slot_ == slot
            if seqlens[req] < 0:
                assert n_hi <= n_lo == 0
            else:
                assert n_hi == min(64 * blk_hi, seqlens[req])
    assert d_status.copy_to_host()[0] == (NEGATIVE_LENGTH if (seqlens < 0).any() else 0)


# ----------------------------------------------------------------------------- make_piece_out

VH, ROWS, WARPS = 64, 64, 8  # two warpgroups of 64 O columns each over 64 packed rows
INV = 0.5


@cuda.jit(device=True, inline="always")
def fragment_value(r, col):
    """What the probe puts in O_i at packed row r, column col (exact in float16 after INV)."""
    return float32(r * 7 + col) * float32(0.25)


def fragment_values(r, cols):
    """``fragment_value`` on the host, for a row's columns."""
    return (r * 7 + cols) * 0.25


@pytest.fixture(scope="module")
def writers():
    made = {}

    def get(dv):
        if dv not in made:
            stage, write = make_piece_out(dv, VH, ROWS, WARPS, "float16")
            DT = VH // 8

            @cuda.jit
            def probe(out, o_acc, split, slot, q_rows, group, hk, status):
                """Fragments of fragment_value staged and written as a decode's epilogue."""
                smem = cuda.shared.array(0, uint16)
                smem_words = cuda.shared.array(0, uint32)
                smem_f32 = cuda.shared.array(0, float32)
                tid = cuda.threadIdx.x
                wg, warp, lane = tid >> 7, tid >> 5, tid & 31
                t2 = (lane & 3) * 2
                r_lo = 16 * (warp & 3) + (lane >> 2)
                O_i = cuda.local.array((1, DT, 4), float32)
                for dt in range(DT):
                    for e in range(4):
                        O_i[0, dt, e] = fragment_value(r_lo + 8 * (e >> 1),
                                                       VH * wg + 8 * dt + t2 + (e & 1))
                for half in range(2):
                    stage(smem_words, smem_f32, 0, O_i, VH * wg, r_lo + 8 * half, half, t2,
                          float32(INV), split)
                cuda.syncthreads()
                write(out, o_acc, smem, smem_f32, 0, split, 0, slot, 0, q_rows, group, hk, warp,
                      lane, status)

            made[dv] = probe
        return made[dv]

    return get


def _expected_rows(q_rows, group, hk, dv):
    """(token, head, values) of every packed row the piece writes."""
    cols = np.arange(dv)
    return [(gr // group, hk * group + gr % group, fragment_values(gr, cols) * INV)
            for gr in range(q_rows)]


@pytest.mark.parametrize("dv, shift", [(128, 0), (100, 0), (23, 0), (128, 1)],
                         ids=["whole", "ragged-chunk", "odd", "unaligned-out"])
def test_a_final_piece_writes_its_rows_and_nothing_else(writers, dv, shift):
    """16-bit rows into ``out`` (a view whose rows start ``shift`` elements into a wider
    buffer: 16-byte stores where aligned, elements otherwise); padding and rows past q_rows keep
    their poison."""
    s_q, h_q, group, hk, q_rows = 10, 10, 5, 1, 47
    poison = np.float16(np.nan).view(np.uint16)
    parent = np.full((1, s_q, h_q, dv + 16), poison, np.uint16)
    out = parent[..., shift:shift + dv]
    o_acc = np.full((2, s_q, h_q, dv), np.nan, np.float32)
    status = np.zeros(1, np.int32)
    d_parent = cuda.to_device(parent)
    d_out = d_parent[:, :, :, shift:shift + dv]
    d_acc = cuda.to_device(o_acc)
    writers(dv)[1, 256, 0, ROWS * 2 * VH * 4](d_out, d_acc, False, 0, q_rows, group, hk,
                                              cuda.to_device(status))
    got = d_parent.copy_to_host()
    want = parent.copy()
    for t, h, values in _expected_rows(q_rows, group, hk, dv):
        want[0, t, h, shift:shift + dv] = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(d_acc.copy_to_host()).all()


@pytest.mark.parametrize("dv", [128, 23])
def test_a_split_piece_writes_float32_rows_to_its_slot_only(writers, dv):
    s_q, h_q, group, hk, q_rows = 10, 10, 5, 1, 50
    o_acc = np.full((3, s_q, h_q, dv), np.nan, np.float32)
    d_acc = cuda.to_device(o_acc)
    d_status = cuda.to_device(np.zeros(1, np.int32))
    d_out = cuda.to_device(np.zeros((1, s_q, h_q, dv), np.uint16))
    writers(dv)[1, 256, 0, ROWS * 2 * VH * 4](d_out, d_acc, True, 1, q_rows, group, hk, d_status)
    want = o_acc.copy()
    for t, h, values in _expected_rows(q_rows, group, hk, dv):
        want[1, t, h] = values
    np.testing.assert_array_equal(d_acc.copy_to_host(), want)
    assert d_status.copy_to_host()[0] == 0 and not d_out.copy_to_host().any()


@pytest.mark.parametrize("slot", [-1, 3])
def test_a_slot_outside_the_accumulators_writes_nothing_and_is_reported(writers, slot):
    o_acc = np.full((3, 10, 10, 128), np.nan, np.float32)
    d_acc = cuda.to_device(o_acc)
    d_status = cuda.to_device(np.zeros(1, np.int32))
    d_out = cuda.to_device(np.zeros((1, 10, 10, 128), np.uint16))
    writers(128)[1, 256, 0, ROWS * 2 * VH * 4](d_out, d_acc, True, slot, 50, 5, 1, d_status)
    assert np.isnan(d_acc.copy_to_host()).all() and not d_out.copy_to_host().any()
    assert d_status.copy_to_host()[0] == BAD_SPLITS


@pytest.fixture(scope="module")
def lookup_probe():
    table_entry, page_of, lookup = make_page_lookup(int32(-1))

    @cuda.jit
    def probe(block_table, num_pages, pages, statuses):
        """Thread (req, blk): its page and validity read both ways (``lookup``, and
        ``table_entry`` + ``page_of``), each with its own status word."""
        req, blk = cuda.threadIdx.x, cuda.threadIdx.y
        page, valid = lookup(block_table, num_pages, req, blk, statuses[req, blk, 0:1])
        early = page_of(table_entry(block_table, req, blk), blk, block_table, num_pages,
                        statuses[req, blk, 1:2])
        pages[req, blk, 0] = page if valid else -2
        pages[req, blk, 1] = early[0] if early[1] else -2

    return probe


def test_a_page_lookup_bounds_the_entry_and_reports_it(lookup_probe):
    """Entries -1 and 5 (of 5 pages) and the column past the table are no page; each is
    reported with its own bit, and both ways of reading agree."""
    table = np.array([[0, 4, -1], [5, 2, 3]], np.int32)
    blocks = table.shape[1] + 1
    pages = cuda.to_device(np.zeros((2, blocks, 2), np.int32))
    statuses = cuda.to_device(np.zeros((2, blocks, 2), np.int32))
    lookup_probe[1, (2, blocks)](cuda.to_device(table), 5, pages, statuses)
    want = np.array([[0, 4, -2, -2], [-2, 2, 3, -2]])
    want_status = np.array([[0, 0, BAD_TABLE_ENTRY, PAST_TABLE],
                            [BAD_TABLE_ENTRY, 0, 0, PAST_TABLE]])
    got, got_status = pages.copy_to_host(), statuses.copy_to_host()
    for way in range(2):
        np.testing.assert_array_equal(got[..., way], want)
        np.testing.assert_array_equal(got_status[..., way], want_status)


@pytest.mark.parametrize("paged", [False, True])
def test_key_row_finds_a_key_in_its_rows_or_behind_the_table(paged):
    """Pages of 3 rows: key n of entry b is slot n % 3 of page table[b, n // 3]; an entry that
    is not a page (5 of 4 pages, -1) is not valid and sets BAD_TABLE_ENTRY. Unpaged, key n of
    entry b is row n of b, always valid."""
    key_row = make_key_row(paged)
    table = np.array([[2, 0, 5], [1, -1, 3]], np.int32)

    @cuda.jit
    def probe(k, table, status, got):
        b, n = cuda.blockIdx.x, cuda.threadIdx.x
        bb, row, valid = key_row(k, table, b, n, status)
        got[b, n, 0], got[b, n, 1], got[b, n, 2] = bb, row, valid

    got, status = np.full((2, 9, 3), -7, np.int64), np.zeros(1, np.int32)
    probe[2, 9](np.zeros((4, 3, 1, 8), np.float32), table, status, got)
    n = np.arange(9)
    if not paged:
        assert (got[..., 0] == [[0], [1]]).all() and (got[..., 1] == n).all()
        assert got[..., 2].all() and status[0] == 0
        return
    assert (got[..., 1] == n % 3).all()
    valid = (table[:, n // 3] >= 0) & (table[:, n // 3] < 4)
    assert (got[..., 2] == valid).all()
    assert (got[..., 0][valid] == table[:, n // 3][valid]).all()
    assert status[0] == BAD_TABLE_ENTRY
