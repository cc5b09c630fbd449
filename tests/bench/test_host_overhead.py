"""bench/host_overhead.py on a GPU: one small run writes a CSV whose times are consistent."""

import sys

import pytest


def test_small_run_writes_consistent_times(bench_module, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (it times host against GPU work)")
    ho, common = bench_module("host_overhead"), bench_module("common")
    monkeypatch.setattr(sys, "argv", ["host_overhead.py", "--seqlens", "256", "--batch", "4",
                                      "--providers", "nf-simt", "--out-dir", str(tmp_path)])
    ho.main()
    (row,) = common.read_csv(tmp_path / "host_overhead.csv")
    assert row["provider"] == "nf-simt" and int(row["seqlen"]) == 256
    assert 0 < float(row["gpu_ms"]) < 1 and 0 < float(row["host_ms"]) < 5
    assert float(row["gpu_tbps"]) > 0 and float(row["bench_ms"]) > 0


@pytest.mark.slow  # it compiles for over a minute on a fresh GPU machine
def test_small_attention_run_writes_consistent_times(bench_module, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (it times host against GPU work)")
    ho, common = bench_module("host_overhead"), bench_module("common")
    monkeypatch.setattr(sys, "argv", ["host_overhead.py", "--op", "bwd", "--shapes", "1,64,2,64",
                                      "--providers", "nf-simt,sdpa-flash",
                                      "--out-dir", str(tmp_path)])
    ho.main()
    rows = common.read_csv(tmp_path / "host_overhead_attention.csv")
    assert [r["provider"] for r in rows] == ["nf-simt", "sdpa-flash"]
    for row in rows:
        assert row["op"] == "bwd" and row["shape"] == "1x64x2x64"
        assert 0 < float(row["gpu_ms"]) < 5 and 0 < float(row["host_ms"]) < 5
