"""MLA tile scheduler: FlashMLA's worked cases and the invariants a decode kernel relies on."""

import numpy as np
import pytest

from numba_flash import scheduler as sch
from numba_flash.scheduler import (BEGIN_BLOCK, BEGIN_REQ, BEGIN_SPLIT, END_BLOCK, END_REQ,
                                   FIRST_SPLIT, FIXED_OVERHEAD_BLOCKS, LAST_SPLIT, plan_mla)


def test_worked_case_uniform_batch():
    seqlens = np.full(128, 4096, dtype=np.int32)
    meta, num_splits = plan_mla(seqlens, 1 * 128 // 1, 1, 132)
    assert meta.shape == (66, 8) and meta.dtype == np.int32
    assert num_splits.dtype == np.int32
    np.testing.assert_array_equal(num_splits, np.arange(129))
    # payload = ceil(128 * (64 + 5) / 66) + 5 = 139: two whole requests per part, 2 parts idle
    for p in range(64):
        np.testing.assert_array_equal(meta[p], [2 * p, 2 * p + 1, 0, 64, 0, 0, 0, 0])
    for p in (64, 65):
        np.testing.assert_array_equal(meta[p], [128, 127, 63, 64, 0, 0, 0, 0])  # (see below)


def test_worked_case_mixed_lengths():
    seqlens = np.array([1000, 10, 0, 300], dtype=np.int32)
    meta, num_splits = plan_mla(seqlens, 128, 1, 132)
    assert meta.shape == (66, 8)
    np.testing.assert_array_equal(num_splits, [0, 16, 17, 18, 23])
    # payload = ceil((16 + 1 + 1 + 5 + 4 * 5) / 66) + 5 = 6: one block per piece
    for p in range(15):
        np.testing.assert_array_equal(meta[p], [0, 0, p, p + 1, p, 1, 1, 0])
    np.testing.assert_array_equal(meta[15], [0, 0, 15, 16, 15, 1, 1, 0])
    np.testing.assert_array_equal(meta[16], [1, 1, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(meta[17], [2, 2, 0, 0, 0, 0, 0, 0])  # seqlen 0: ends at block 0
    for k in range(5):
        np.testing.assert_array_equal(meta[18 + k], [3, 3, k, k + 1, k, 1, 1, 0])
    for p in range(23, 66):
        # idle: begin_block is request 0's last block, as FlashMLA's planner writes it
        np.testing.assert_array_equal(meta[p], [4, 3, 15, 5, 0, 0, 0, 0])


def test_helpers():
    assert sch.num_sm_parts(132, 1, 128) == 66
    assert sch.num_sm_parts(132, 1, 64) == 132
    assert sch.num_sm_parts(132, 1, 16) == 132
    assert sch.num_sm_parts(132, 1, 256) == 33  # s_q = 2, h_q = 128
    assert sch.num_sm_parts(132, 2, 65) == 33  # 132 // 2 // 2
    assert sch.num_sm_parts(1, 1, 128) == 1
    assert sch.num_sm_parts(100, 8, 1000) == 1  # never below 1
    np.testing.assert_array_equal(sch.num_blocks([0, 1, 63, 64, 65, 128, 129, 4096]),
                                  [1, 1, 1, 1, 2, 2, 3, 64])
    assert sch.payload([16, 1, 1, 5], 66) == 6


def check_plan(seqlens, q_rows, h_kv, num_sms):
    """Every invariant of the metadata contract (see the scheduler module docstring)."""
    seqlens = np.asarray(seqlens, dtype=np.int32)
    b = len(seqlens)
    meta, num_splits = plan_mla(seqlens, q_rows, h_kv, num_sms)
    parts = sch.num_sm_parts(num_sms, h_kv, q_rows)
    nb = sch.num_blocks(seqlens)
    budget = sch.payload(nb, parts)
    assert meta.shape == (parts, 8) and meta.dtype == np.int32
    assert num_splits.shape == (b + 1,) and num_splits.dtype == np.int32
    assert num_splits[0] == 0
    pieces = np.diff(num_splits.astype(np.int64))
    assert (pieces >= 1).all()
    assert num_splits[-1] <= b + parts - 1  # accumulators of b + num_sm_parts slots suffice
    assert (meta[:, 7] == 0).all()

    covered = [0] * b  # next block each request expects, walking parts in order
    seen_pieces = [0] * b
    slots = []
    idle_seen = False
    for p in range(parts):
        row = meta[p]
        if row[BEGIN_REQ] >= b:  # idle: only trailing rows, FlashMLA's exact shape
            idle_seen = True
            last_end = int(nb[-1]) if b and seqlens[-1] > 0 else 0
            first_last = int(nb[0]) - 1 if b else 0
            np.testing.assert_array_equal(row, [b, b - 1, first_last, last_end, 0, 0, 0, 0])
            assert sch.part_pieces(row, seqlens, num_splits) == []
            continue
        assert not idle_seen, "a busy part follows an idle one"
        assert 0 <= row[BEGIN_REQ] <= row[END_REQ] < b
        assert row[BEGIN_SPLIT] == seen_pieces[row[BEGIN_REQ]]
        work = sch.part_pieces(row, seqlens, num_splits)
        assert [w[0] for w in work] == list(range(row[BEGIN_REQ], row[END_REQ] + 1))
        cost = 0
        for k, (req, lo, hi, slot, split) in enumerate(work):
            assert lo == covered[req], "blocks must be covered in order, exactly once"
            empty = seqlens[req] == 0 and k == len(work) - 1  # a part ending on a length 0
            assert (lo == hi == 0) if empty else lo < hi <= nb[req]
            if 0 < k < len(work) - 1:  # requests in the middle of a part are whole
                assert lo == 0 and hi == nb[req] and not split
            assert split == (pieces[req] > 1)
            assert slot == num_splits[req] + seen_pieces[req]
            covered[req] = nb[req] if empty else hi
            seen_pieces[req] += 1
            slots.append(slot)
            cost += (1 if empty else hi - lo) + FIXED_OVERHEAD_BLOCKS
        assert cost <= budget
        if row[BEGIN_REQ] == row[END_REQ]:
            assert row[FIRST_SPLIT] == row[LAST_SPLIT]
        assert row[FIRST_SPLIT] == (pieces[row[BEGIN_REQ]] > 1)
        assert row[LAST_SPLIT] == (pieces[row[END_REQ]] > 1)
        assert row[BEGIN_BLOCK] == work[0][1] and row[END_BLOCK] == work[-1][2]
    assert covered == [int(x) for x in nb], "every block of every request is covered"
    assert seen_pieces == [int(x) for x in pieces]
    assert sorted(slots) == list(range(int(num_splits[-1])))  # each slot written by one piece
    return meta, num_splits


SPECIAL = np.array([0, 1, 2, 63, 64, 65, 127, 128, 129, 64 * 7, 64 * 7 + 1, 4096, 4097])


@pytest.mark.parametrize("num_sms", [1, 7, 78, 108, 132, 264])
@pytest.mark.parametrize("h_q,s_q,h_kv", [(16, 1, 1), (128, 1, 1), (128, 2, 1), (64, 1, 4),
                                          (8, 1, 8)])
def test_random_plans(num_sms, h_q, s_q, h_kv):
    rng = np.random.default_rng([num_sms, h_q, s_q, h_kv])
    q_rows = s_q * h_q // h_kv
    for b in (1, 2, 5, 17, 64, 200):
        lens = rng.choice(SPECIAL, size=b)
        mix = rng.random(b)
        lens = np.where(mix < 0.3, rng.integers(0, 40000, size=b), lens)
        lens = np.where(mix > 0.9, 64 * rng.integers(1, 300, size=b) + rng.integers(0, 2, size=b),
                        lens)
        check_plan(lens, q_rows, h_kv, num_sms)


@pytest.mark.parametrize("seqlens", [[0], [1], [0, 0, 0], [64], [65], [1 << 20], [1 << 20, 1],
                                     [1, 1 << 20], [64] * 500, [0] * 300])
@pytest.mark.parametrize("num_sms", [1, 3, 132])
def test_edge_plans(seqlens, num_sms):
    check_plan(seqlens, 128, 1, num_sms)


def test_one_long_request_is_spread_over_every_part():
    meta, num_splits = check_plan([1 << 20], 64, 1, 132)
    assert (meta[:, BEGIN_REQ] == 0).all() and (meta[:, END_REQ] == 0).all()
    assert num_splits[1] == 132
    # every piece pays the overhead but the total counts it once: all parts take payload - 5
    # blocks, the last one what is left
    sizes = meta[:, END_BLOCK] - meta[:, BEGIN_BLOCK]
    budget = sch.payload(sch.num_blocks([1 << 20]), 132)
    assert (sizes[:-1] == budget - FIXED_OVERHEAD_BLOCKS).all()
    assert 0 < sizes[-1] <= budget - FIXED_OVERHEAD_BLOCKS


def test_single_part_never_splits():
    meta, num_splits = check_plan([5000, 0, 70, 1 << 16], 128, 1, 1)
    np.testing.assert_array_equal(num_splits, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(meta, [[0, 3, 0, 1024, 0, 0, 0, 0]])


def test_empty_batch():
    meta, num_splits = plan_mla(np.zeros(0, np.int32), 128, 1, 132)
    np.testing.assert_array_equal(num_splits, [0])
    assert meta.shape == (66, 8)
    assert (meta == np.array([0, -1, 0, 0, 0, 0, 0, 0])).all()


@pytest.mark.parametrize("args,exc,word", [
    ((np.array([[1, 2]], np.int32), 128, 1, 132), ValueError, "cache_seqlens"),
    ((np.array([1.5]), 128, 1, 132), TypeError, "cache_seqlens"),
    ((np.array([-1], np.int32), 128, 1, 132), ValueError, "cache_seqlens"),
    ((np.array([1], np.int32), 0, 1, 132), ValueError, "num_q_tokens_per_head_k"),
    ((np.array([1], np.int32), 128, 0, 132), ValueError, "num_heads_k"),
    ((np.array([1], np.int32), 128, 1, 0), ValueError, "num_sms"),
])
def test_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        plan_mla(*args)
