"""bench/common.py: FLOP and byte formulas, CSV writing and reading, tables, progress, plots."""

import math

import pytest


def test_attention_flops(bench_module):
    common = bench_module("common")
    # Two matmuls of (Sq x D) (D x Sk) per head: 2 * 2 * Sq * Sk * D.
    assert common.attention_flops(1, 1, 3, 5, 8, False) == 4 * 3 * 5 * 8
    assert common.attention_flops(2, 3, 4, 4, 8, True) == 0.5 * 4 * 2 * 3 * 4 * 4 * 8
    assert common.attention_flops(2, 3, 4, 4, 8, True, "bwd") == 2.5 * common.attention_flops(
        2, 3, 4, 4, 8, True)


def test_mla_decode_formulas(bench_module):
    common = bench_module("common")
    # docs/design.md: b=128, s_q=1, h_q=128, d=576, dv=512, seqlen 4096.
    assert common.mla_decode_flops(128, 1, 128, 576, 512, 4096) == 128 * 128 * (2 * 576 + 2 * 512) * 4096
    by_hand = 128 * (1 * 128 * 576 + 4096 * 1 * 576 + 1 * 128 * 512) * 2
    assert common.mla_decode_bytes(128, 1, 128, 1, 576, 512, 4096) == by_hand
    # The cache dominates: q and out add about 6 % at this size.
    assert by_hand < 1.07 * 128 * 4096 * 576 * 2


def test_rotated_starts_each_round_one_provider_further(bench_module):
    common = bench_module("common")
    assert [common.rotated(list("abc"), r) for r in range(4)] == [
        list("abc"), list("bca"), list("cab"), list("abc")]
    assert common.rotated([], 3) == []


def test_csv_round_trip_keeps_header_and_all_columns(bench_module, tmp_path, monkeypatch):
    common = bench_module("common")
    monkeypatch.setenv("NF_BENCH_COMMIT", "abc1234")
    rows = [dict(provider="a", ms=1.5, n=1024), dict(provider="b", ms=float("nan"), n=2048, note="x")]
    path = common.write_csv(tmp_path / "r.csv", rows)
    text = path.read_text().splitlines()
    header = [line for line in text if line.startswith("#")]
    assert [h.split(":")[0] for h in header] == ["# date", "# gpu", "# commit", "# command"]
    assert "# commit: abc1234" in header
    back = common.read_csv(path)
    assert [r["provider"] for r in back] == ["a", "b"]
    assert back[0]["note"] == "" and back[1]["note"] == "x"  # a key of a later row only
    assert float(back[0]["ms"]) == 1.5 and math.isnan(float(back[1]["ms"]))


def test_results_dir(bench_module, tmp_path, monkeypatch):
    common = bench_module("common")
    assert common.results_dir(tmp_path / "x" / "y") == tmp_path / "x" / "y"
    assert (tmp_path / "x" / "y").is_dir()
    # By default one folder per GPU, named by gpu_name() alone (no date): bench/results/<gpu>/.
    assert (common.RESULTS.parent.name, common.RESULTS.name) == ("bench", "results")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(common, "gpu_name", lambda: "NVIDIA-H200")
    assert common.results_dir() == tmp_path / "results" / "NVIDIA-H200"
    assert (tmp_path / "results" / "NVIDIA-H200").is_dir()


def test_format_table(bench_module):
    common = bench_module("common")
    table = common.format_table([dict(p="nf", t=12.3456), dict(p="sdpa-flash", t=345.6)], ["p", "t"])
    lines = table.splitlines()
    assert lines[0].split() == ["p", "t"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["nf", "12.3"] and lines[3].split() == ["sdpa-flash", "346"]
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_progress_counts_to_total(bench_module, capsys):
    common = bench_module("common")
    bar = common.Progress(3)
    for label in ("a", "b", "c"):
        bar.step(label)
    err = capsys.readouterr().err
    assert "[1/3] a" in err and "[3/3] c" in err and err.endswith("\n")


def test_the_triton_kernels_folder_cannot_pass_for_triton(bench_module):
    """With bench/ on sys.path, a folder named ``triton`` there would be imported as Triton
    wherever Triton is not installed (torch.compile then fails on ``triton.language``)."""
    common = bench_module("common")
    assert common.TRITON_DIR.name != "triton"
    assert not (common.TRITON_DIR.parent / "triton").exists()
    assert not (common.TRITON_DIR / "__init__.py").exists()
    assert {p.name for p in common.TRITON_DIR.glob("*.py")} >= {"flash_fwd.py", "flash_bwd.py",
                                                                 "mla_decode.py"}


def test_plot_panels(bench_module, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    common = bench_module("common")
    rows = [dict(mode=m, d=d, n=n, provider=p, y=(n / 1000 if p == "a" else float("nan") if n == 2 else 1.0))
            for m in ("fwd", "bwd") for d in (64, 128) for p in ("a", "b") for n in (1, 2, 4)]
    path = common.plot_panels(tmp_path / "p.png", rows, "n", "y", ["mode", "d"], "provider",
                              "N", "TFLOP/s", "title", hline=(2.0, "copy"))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(bench_module, tmp_path, monkeypatch, capsys):
    import builtins

    common = bench_module("common")
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert common.plot_panels(tmp_path / "p.png", [], "n", "y", [], "p", "", "", "") is None
    assert "matplotlib not installed" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()
