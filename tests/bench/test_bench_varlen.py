"""bench/bench_varlen.py: the random batch, the FLOPs of its visible pairs and the arguments (the
timed run itself needs a GPU: its numbers are bench/results/NVIDIA-H200/varlen.csv)."""

import pytest


@pytest.mark.parametrize("tokens, lo, hi, seed", [(32768, 128, 4096, 0), (1000, 100, 300, 3),
                                                  (129, 128, 4096, 1)])
def test_lengths_fill_the_tokens_within_their_bounds(bench_module, tokens, lo, hi, seed):
    bv = bench_module("bench_varlen")
    lens = bv.lengths(tokens, lo, hi, seed)
    assert sum(lens) == tokens
    assert all(n <= hi for n in lens[:-1]) and lens == bv.lengths(tokens, lo, hi, seed)
    # only the last may leave the bounds: cut to fit, or merged into the one before
    assert all(lo <= n for n in lens[:-1]) and (len(lens) == 1 or lens[-1] >= lo)


def test_flops_count_each_sequence_alone(bench_module):
    bv = bench_module("bench_varlen")
    # two sequences of 3 and 5 rows, 2 heads, D 8: 4 H D sum(L^2), halved causal, 2.5x backward
    assert bv.varlen_flops([3, 5], 2, 8, False, "fwd") == 4 * 2 * 8 * (9 + 25)
    assert bv.varlen_flops([3, 5], 2, 8, True, "bwd") == 4 * 2 * 8 * (9 + 25) * 0.5 * 2.5


def test_parse_args(bench_module):
    a = bench_module("bench_varlen").parse_args([])
    assert (a.modes, a.dtypes, a.head_dims, a.causal) == ("fwd,bwd", "bfloat16", "64,128", "both")
    assert (a.tokens, a.min_len, a.max_len, a.repeats) == (32768, 128, 4096, 3)


def test_paginate_puts_each_key_where_the_table_says(bench_module):
    """Key j of sequence b is row j % page of page table[b, j // page]; pages hold one
    sequence each and the padding rows are zero."""
    import torch

    bv = bench_module("bench_varlen")
    lens, page = [5, 1, 4], 2
    x = torch.arange(10 * 3, dtype=torch.float32).view(10, 3, 1) + 1
    pages, table = bv.paginate(x, lens, page, seed=4)
    assert pages.shape == (3 + 1 + 2, page, 3, 1) and table.dtype == torch.int32
    start = 0
    for b, n in enumerate(lens):
        for j in range(n):
            assert torch.equal(pages[table[b, j // page], j % page], x[start + j])
        start += n
    assert (pages != 0).sum() == x.numel()  # every row once, the padding zero
    assert sorted(table[0].tolist() + table[1, :1].tolist() + table[2, :2].tolist()) == list(range(6))
