"""bench/bench_attention.py: arguments, anchor ratios, plots, and the whole script on the CPU
(torch on the CPU, numba_flash in the simulator, Triton in its interpreter) when torch and Triton
are installed."""

import importlib.util
import math
import time

import pytest


def test_parse_args(bench_module):
    ba = bench_module("bench_attention")
    a = ba.parse_args([])
    assert a.modes == ("fwd",) and a.dtype_names == ["float16", "bfloat16"]
    assert a.head_dim_list == [64, 128] and a.seqlen_list == [1024, 4096, 16384]
    assert a.causal_list == [False, True] and a.provider_list is None and not a.no_plot
    assert a.repeats == 1
    q = ba.parse_args(["--quick", "--mode", "both", "--causal", "1", "--providers", "triton,naive"])
    assert q.modes == ("fwd", "bwd") and q.dtype_names == ["float16"]
    assert q.head_dim_list == [64] and q.seqlen_list == [1024, 4096]
    assert q.causal_list == [True] and q.provider_list == ["triton", "naive"]
    with pytest.raises(SystemExit):
        ba.parse_args(["--mode", "sideways"])
    with pytest.raises(SystemExit):
        ba.parse_args(["--repeats", "0"])


def test_only_the_named_providers_are_probed(bench_module, monkeypatch):
    """A run that names its providers does not build or probe the others (the simulator or a
    GPU compile of every kernel family would cost minutes)."""
    pytest.importorskip("torch")
    ba = bench_module("bench_attention")
    made = []

    def maker(name):
        def make(*args):
            made.append(name)
            return (lambda q, k, v, causal: q), None
        return make

    for fn in ("_numba_flash", "_sdpa", "_triton", "_naive"):
        monkeypatch.setattr(ba, fn, maker(fn))
    monkeypatch.setattr(ba, "DEVICE", "cpu")
    assert list(ba.providers_available(("fwd",), ["naive", "nope"])) == ["naive"]
    assert made == ["_naive"]


def test_rounds_rotate_the_providers_and_report_medians(bench_module):
    """Each round starts one provider further on, so none is always timed first or last; each
    provider's time is the median of its rounds."""
    ba = bench_module("bench_attention")
    calls = []
    samples = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 9.0, 4.0]), "c": iter([7.0, 7.0, 8.0])}

    def timer(name):
        def run():
            calls.append(name)
            return next(samples[name])
        return run

    steps = []
    times = ba.time_point({n: timer(n) for n in "abc"}, 3, lambda n, r: steps.append((n, r)))
    assert calls == list("abc" "bca" "cab")
    assert steps == [(n, r) for r, order in enumerate(("abc", "bca", "cab")) for n in order]
    assert times == {"a": 2.0, "b": 5.0, "c": 7.0}
    assert ba.time_point({}, 2) == {}


def test_ratios_to_the_anchor_match_points(bench_module):
    ba = bench_module("bench_attention")
    point = dict(mode="fwd", dtype="float16", head_dim=64, causal=0)
    rows = [dict(point, seqlen=1024, provider="sdpa-flash", ms=2.0),
            dict(point, seqlen=1024, provider="nf-simt", ms=8.0),
            dict(point, seqlen=4096, provider="nf-simt", ms=1.0),         # no anchor at this N
            dict(point, seqlen=1024, provider="naive", ms=float("nan"))]  # skipped point
    ba.finish_rows(rows)
    assert [r["vs_sdpa-flash"] for r in rows[:2]] == [1.0, 0.25]
    assert math.isnan(rows[2]["vs_sdpa-flash"]) and math.isnan(rows[3]["vs_sdpa-flash"])


def test_plot_one_png_per_dtype(bench_module, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    ba = bench_module("bench_attention")
    rows = [dict(mode=m, dtype=dt, head_dim=64, causal=c, seqlen=n, batch=32768 // n, provider=p,
                 tflops=float(n) / 100)
            for m in ("fwd", "bwd") for dt in ("float16", "bfloat16") for c in (0, 1)
            for n in (1024, 4096) for p in ("nf-simt", "triton")]
    paths = ba.plot(rows, tmp_path, "both")
    assert sorted(p.name for p in paths) == ["attention_both_bfloat16.png", "attention_both_float16.png"]


def test_whole_script_on_cpu(bench_module, triton_kernels, tmp_path, monkeypatch):
    """Both modes, every CPU-capable provider, on a tiny grid: each must pass its reference
    check, get a time, and land in the CSV and the plots."""
    torch, device = pytest.importorskip("torch"), "cpu"
    if torch.cuda.is_available():
        pytest.skip("the GPU run is the real benchmark")
    ba = bench_module("bench_attention")
    common = bench_module("common")
    monkeypatch.setattr(ba, "DEVICE", device)
    monkeypatch.setattr(ba, "CHECK_SHAPE", (1, 24, 2))
    monkeypatch.setattr(ba, "PROBE_SHAPE", (1, 8, 1, 16))

    def one_call_ms(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    monkeypatch.setattr(common, "time_ms", one_call_ms)
    monkeypatch.setattr(ba, "naive_scratch_note", lambda b, h, n: "")
    argv = ["--mode", "both", "--dtypes", "float16", "--head-dims", "16", "--seqlens", "16,32",
            "--causal", "1", "--tokens", "32", "--hidden", "16", "--out-dir", str(tmp_path),
            "--providers", "sdpa-flash,nf-simt,triton,naive", "--repeats", "2"]
    assert ba.main(argv) == 0
    rows = common.read_csv(tmp_path / "attention_both.csv")
    fwd = {(r["provider"], r["seqlen"], r["causal"]) for r in rows if r["mode"] == "fwd"}
    bwd = {(r["provider"], r["seqlen"], r["causal"]) for r in rows if r["mode"] == "bwd"}
    assert fwd == {(p, n, c) for p in ("sdpa-flash", "nf-simt", "triton", "naive")
                   for n in ("16", "32") for c in ("1",)}
    assert {p for p, _, _ in bwd} == {"sdpa-flash", "nf-simt", "triton"}  # naive: forward only
    assert all(r["correct"] == "1" and float(r["tflops"]) > 0 for r in rows), rows
    anchor = [r for r in rows if r["provider"] == "sdpa-flash"]
    assert all(float(r["vs_sdpa-flash"]) == 1.0 for r in anchor)
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "attention_both_float16.png").exists()
