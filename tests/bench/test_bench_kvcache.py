"""bench/bench_kvcache.py: the bytes a decode step moves and the arguments (the timed run needs a
GPU: its numbers are bench/results/NVIDIA-H200/kvcache.csv)."""


def test_step_bytes_count_both_caches_once(bench_module):
    bk = bench_module("bench_kvcache")
    # B 2, Hq 4, Hk 2, D 8, 10 keys, 2-byte elements: K and V caches, q, new k and v, out
    assert bk.step_bytes(2, 4, 2, 8, 10) == 2 * (2 * 2 * 10 * 2 * 8 + 2 * 2 * 4 * 8 + 2 * 2 * 2 * 8)
    # FP8 caches: one byte a cached value, the rest as before
    assert bk.step_bytes(2, 4, 2, 8, 10, cache_elem=1) == (2 * 2 * 10 * 2 * 8
                                                            + 2 * (2 * 2 * 4 * 8 + 2 * 2 * 2 * 8))


def test_parse_args(bench_module):
    a = bench_module("bench_kvcache").parse_args([])
    assert (a.batch, a.heads_q, a.heads_kv, a.head_dim) == (64, 32, 8, 128)
    assert (a.seqlens, a.pages, a.num_splits, a.repeats) == (
        "1024,2048,4096,8192,16384,32768", "16,64", 0, 3)
