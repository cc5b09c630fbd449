"""bench/bench_window.py: the visible pairs its TFLOP/s count and the arguments (the timed run
itself needs a GPU: its numbers are bench/results/NVIDIA-H200/window.csv)."""

import pytest

from numba_flash import reference as ref


@pytest.mark.parametrize("n, left", [(1, 0), (7, 0), (7, 3), (7, 6), (7, 100), (9, -1),
                                     (4096, 1024)])
def test_visible_pairs_count_the_window_mask(bench_module, n, left):
    bw = bench_module("bench_window")
    size = min(n, 64)  # the mask, built from the definition, on a small n; the formula beyond
    want = int(ref.window_mask(size, size, (left, 0), causal=True).sum())
    assert bw.visible_pairs(size, left) == want
    if left >= 0 and n > left:
        assert bw.visible_pairs(n, left) == n * (left + 1) - left * (left + 1) // 2


def test_parse_args(bench_module):
    a = bench_module("bench_window").parse_args([])
    assert (a.modes, a.window, a.seqlens, a.head_dims) == ("fwd,bwd", 1024, "4096,16384", "64,128")
    assert a.dtypes == "float16,bfloat16"
    assert (a.tokens, a.hidden, a.repeats) == (32768, 2048, 3)
