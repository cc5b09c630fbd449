"""bench/bench_mla.py: arguments, inputs, the torch baseline against the float64 reference, and
the whole script on the CPU (Triton in its interpreter) when torch and Triton are installed."""

import importlib.util
import time

import numpy as np
import pytest

from numba_flash import reference


def test_parse_args(bench_module):
    bm = bench_module("bench_mla")
    a = bm.parse_args([])
    assert (a.batch, a.heads_kv, a.head_dim, a.head_dim_v, a.page) == (128, 1, 576, 512, 64)
    assert a.s_q_list == [1, 2] and a.heads_q_list == [1, 16, 32, 64, 128]
    assert a.seqlen_list == [4096, 8192, 16384, 32768] and a.causal == "1" and not a.varlen
    q = bm.parse_args(["--quick", "--providers", "triton,torch"])
    assert q.s_q_list == [1] and q.heads_q_list == [128] and q.seqlen_list == [4096, 8192]
    assert q.provider_list == ["triton", "torch"]
    assert a.repeats == 1 and bm.parse_args(["--repeats", "3"]).repeats == 3
    with pytest.raises(SystemExit):
        bm.parse_args(["--repeats", "0"])


def test_only_the_named_providers_are_probed(bench_module, monkeypatch):
    torch = pytest.importorskip("torch")
    bm = bench_module("bench_mla")
    monkeypatch.setattr(bm, "DEVICE", "cpu")
    made = []

    def maker(name):
        def make():
            made.append(name)
            return lambda *inputs: (lambda: None)
        return make

    monkeypatch.setattr(bm, "PROVIDERS", {n: maker(n) for n in ("nf-simt", "nf-tc", "torch")})
    assert list(bm.providers_available(["torch", "nope"])) == ["torch"] and made == ["torch"]
    assert list(bm.providers_available()) == ["nf-simt", "nf-tc", "torch"]


def test_draw_seqlens(bench_module):
    bm = bench_module("bench_mla")
    assert bm.draw_seqlens(3, 4096, False) == [4096] * 3
    lens = bm.draw_seqlens(1000, 4096, True)
    assert min(lens) >= 2048 and max(lens) <= 6144 and len(set(lens)) > 100
    assert abs(np.mean(lens) - 4096) < 150


@pytest.mark.parametrize("s_q,h_q,h_kv,causal", [(1, 4, 1, False), (2, 4, 2, True)])
def test_torch_baseline_and_inputs_match_reference(bench_module, torch_device, monkeypatch,
                                                   s_q, h_q, h_kv, causal):
    torch, device = torch_device
    bm = bench_module("bench_mla")
    monkeypatch.setattr(bm, "DEVICE", device)
    lens = [50, 7, 64, 130]
    q, k_cache, table, seqlens = bm.make_inputs(4, s_q, h_q, h_kv, 48, 16, lens, torch.float16, seed=1)
    assert table.dtype == torch.int32 and seqlens.tolist() == lens
    assert sorted(table[table > 0].tolist() + [0]) == list(range(k_cache.shape[0]))  # each page once
    out, lse = bm.torch_decode(q, k_cache, table, seqlens, 32, causal)
    host = lambda t: t.float().cpu().numpy()  # noqa: E731
    ref_out, ref_lse = reference.mla_decode_ref(host(q), host(k_cache), host(table).astype(np.int32),
                                                np.array(lens, dtype=np.int32), 32, causal=causal)
    assert out.shape == (4, s_q, h_q, 32) and lse.shape == (4, h_q, s_q)
    assert np.abs(host(out) - ref_out).max() < 1e-2
    assert np.abs(host(lse) - ref_lse).max() < 1e-3


@pytest.fixture
def script_on_cpu(bench_module, monkeypatch):
    """(bench_mla, common) with the script's inputs on the CPU (where torch has no GPU: the GPU
    run is the real benchmark) and a small copy-bandwidth measurement."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the GPU run is the real benchmark")
    bm = bench_module("bench_mla")
    monkeypatch.setattr(bm, "DEVICE", "cpu")
    monkeypatch.setattr(bm, "COPY_BYTES", 1 << 20)
    return bm, bench_module("common")


def test_whole_script_on_cpu(script_on_cpu, triton_kernels, tmp_path, monkeypatch):
    bm, common = script_on_cpu

    def one_call_ms(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    monkeypatch.setattr(common, "time_ms", one_call_ms)
    # float16: the interpreter computes tl.dot on bfloat16 wrongly.
    argv = ["--batch", "2", "--s-q", "2", "--heads-q", "16", "--seqlens", "64,100", "--varlen",
            "--dtype", "float16", "--providers", "triton,torch", "--out-dir", str(tmp_path)]
    assert bm.main(argv) == 0
    rows = common.read_csv(tmp_path / "mla_decode.csv")
    assert {(r["provider"], r["seqlen"]) for r in rows} == {
        (p, n) for p in ("triton", "torch") for n in ("64", "100")}
    for r in rows:
        assert r["correct"] == "1" and float(r["tbps"]) > 0 and float(r["tflops"]) > 0, r
        assert float(r["vs_copy"]) == pytest.approx(float(r["tbps"]) / float(r["copy_tbps"]))
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "mla_decode.png").exists()


def test_repeats_time_every_round_on_a_fresh_cache(script_on_cpu, tmp_path, monkeypatch):
    bm, common = script_on_cpu
    monkeypatch.setattr(bm, "copy_bandwidth", lambda: 1.0)  # time_ms below counts the timed calls
    times = iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0])  # ms of the timed calls, in call order
    monkeypatch.setattr(common, "time_ms", lambda fn: (fn(), next(times))[1])
    seeds = []
    make_inputs = bm.make_inputs

    def recorded(b, s_q, h_q, h_kv, d, page, seqlens, dtype, seed=None):
        if seqlens in ([64] * 2, [100] * 2):  # the timed inputs, not the probe's or the check's
            seeds.append((seqlens[0], seed))
        return make_inputs(b, s_q, h_q, h_kv, d, page, seqlens, dtype, seed=seed)

    monkeypatch.setattr(bm, "make_inputs", recorded)
    argv = ["--batch", "2", "--s-q", "1", "--heads-q", "4", "--seqlens", "64,100", "--head-dim",
            "48", "--head-dim-v", "32", "--page", "16", "--dtype", "float16", "--providers",
            "torch", "--repeats", "3", "--no-plot", "--out-dir", str(tmp_path)]
    assert bm.main(argv) == 0
    # each point's rounds on caches and permutations of their own, seeded by the round
    assert seeds == [(64, 0), (64, 1), (64, 2), (100, 0), (100, 1), (100, 2)]
    rows = common.read_csv(tmp_path / "mla_decode.csv")
    got = [(r["seqlen"], r["rounds"], float(r["ms"]), float(r["ms_min"]), float(r["ms_max"]))
           for r in rows]
    assert got == [("64", "3", 2.0, 1.0, 3.0), ("100", "3", 5.0, 4.0, 6.0)]
    nbytes = common.mla_decode_bytes(2, 1, 4, 1, 48, 32, 100)
    assert float(rows[1]["tbps"]) == pytest.approx(nbytes / 5.0 * 1e-9)
