"""bench/bench_context_parallel.py: its defaults, its per-GPU FLOP count and its shards (the
timed run itself needs several GPUs and torchrun)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_parse_args(bench_module):
    a = bench_module("bench_context_parallel").parse_args([])
    assert (a.modes, a.tokens_per_gpu, a.head_dims, a.causal, a.repeats) == (
        "fwd,bwd", "8192,32768", "128", "1", 3)
    assert a.providers.split(",") == ["nf-ring", "nf-single", "torch-cp"]


def test_per_gpu_tflops_shares_the_whole_sequence(bench_module):
    bm = bench_module("bench_context_parallel")
    # 2 GPUs of 1024 tokens: the 2048-token causal forward's 4 * 2048^2 * 16 * 64 / 2 FLOPs,
    # half on each GPU, in 1 ms.
    want = 4 * 2048 ** 2 * 16 * 64 / 2 / 2 / 1e-3 / 1e12
    assert bm.per_gpu_tflops(1024, 2, 16, 64, True, "fwd", 1.0) == pytest.approx(want)


def test_shards_are_the_ranks_rows(bench_module):
    bm = bench_module("bench_context_parallel")
    x = torch.arange(16.0).view(1, 16, 1, 1)
    rows = [bm.shard(x, r, 2).flatten().tolist() for r in range(2)]
    assert rows == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(16))
