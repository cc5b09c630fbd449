"""bench/bench_mla_sparse.py: its FLOP and byte counts and arguments (the timed run needs a
GPU and FlashMLA's sparse build)."""


def test_flops_and_bytes_count_every_index_once_per_token(bench_module):
    bs = bench_module("bench_mla_sparse")
    # b 2, s_q 3, h_q 4, topk 5: 24 rows scoring 5 keys of 576 columns and summing 512
    assert bs.sparse_flops(2, 3, 4, 5) == 2 * 24 * 5 * (576 + 512)
    assert bs.sparse_bytes(2, 3, 4, 5) == 6 * 5 * 656 + 2 * 24 * (576 + 512)


def test_parse_args(bench_module):
    a = bench_module("bench_mla_sparse").parse_args([])
    assert (a.batch, a.s_q, a.heads_q, a.topk, a.seqlen) == ("64,128", "1,2", "64,128", 2048,
                                                            32768)


def test_the_gpu_quantizer_writes_the_reference_rows(bench_module):
    import numpy as np
    import pytest

    torch = pytest.importorskip("torch")
    from numba_flash import reference as ref

    kv = (np.random.default_rng(3).standard_normal((5, 576)) / 4).astype(np.float32)
    kv[2, :128] = 0  # a block of zeros: scale 1
    got = bench_module("bench_mla_sparse").quantize_v32(torch.from_numpy(kv)).numpy()
    np.testing.assert_array_equal(got, ref.quantize_v32(kv))
