"""bench/io_bytes.py: ncu output parsing (canned samples), model fits, the no-ncu path, the whole
pipeline with a stand-in for ncu, and the child's forward (simulator: tiny shapes)."""

import importlib.util
import math
import os
import stat
import sys
import textwrap

import numpy as np
import pytest

from numba_flash import reference as ref
from helpers import to_host

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def _line(launch, kernel, metric, unit, value):
    return (f'"{launch}","4242","python3.12","127.0.0.1","{kernel}","1","7","(256, 1, 1)",'
            f'"(8, 8, 2)","0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"')


# Program output and ==PROF== notes first, then one line per (launch, metric); kernel names
# hold commas, values thousands separators.
SAMPLE = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    '==PROF== Profiling "naive_scores": 0%....50%....100% - 1 pass',
    "==PROF== Disconnected from process 4242",
    HEADER,
    _line(0, "cudapy::naive_scores(Array<unsigned short, 4, A>, int, float)",
          "dram__bytes_read.sum", "byte", "1,048,576"),
    _line(0, "cudapy::naive_scores(Array<unsigned short, 4, A>, int, float)",
          "dram__bytes_write.sum", "byte", "2,097,152"),
    _line(1, "cudapy::naive_softmax(Array<float, 4, A>, int)", "dram__bytes_read.sum", "Mbyte", "2.5"),
    _line(1, "cudapy::naive_softmax(Array<float, 4, A>, int)", "dram__bytes_write.sum", "byte", "0"),
]) + "\n"


def test_parse_ncu_csv_sums_launches(bench_module):
    io_bytes = bench_module("io_bytes")
    totals = io_bytes.parse_ncu_csv(SAMPLE)
    assert totals == {"dram__bytes_read.sum": 1048576 + 2.5e6, "dram__bytes_write.sum": 2097152,
                      "kernels": 2}


def test_parse_ncu_csv_refuses_what_it_cannot_read(bench_module):
    io_bytes = bench_module("io_bytes")
    with pytest.raises(ValueError, match="no ncu CSV header"):
        io_bytes.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM - no permission\n")
    with pytest.raises(ValueError, match="unknown unit"):
        io_bytes.parse_ncu_csv(HEADER + "\n" + _line(0, "k", "dram__bytes_read.sum", "sectors", "3"))


def test_models_and_fit(bench_module):
    io_bytes = bench_module("io_bytes")
    assert io_bytes.naive_model(1024, 64) == 1024 * 64 + 1024 ** 2
    assert io_bytes.flash_model(2048, 64, 16384) == 4 * io_bytes.flash_model(1024, 64, 16384)
    model = [1.0, 4.0, 16.0]
    assert io_bytes.fit_scale([3.0, 12.0, 48.0], model) == pytest.approx(3.0)
    assert io_bytes.fit_scale([2.0, 8.0, 0.0], model) == pytest.approx(2.0)  # zeros ignored
    assert math.isnan(io_bytes.fit_scale([0.0], [1.0]))


def test_without_ncu_says_so_and_exits_0(bench_module, tmp_path, capsys):
    io_bytes = bench_module("io_bytes")
    assert io_bytes.main(["--ncu", str(tmp_path / "no-ncu"), "--out-dir", str(tmp_path)]) == 0
    assert "not found" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_pipeline_with_a_stand_in_ncu(bench_module, tmp_path):
    """A fake ncu that prints the CSV ncu would, with naive traffic ~ N^2 and flash ~ N: the
    script must call it once per (kernel, N) with the child's arguments, sum, fit and write."""
    io_bytes = bench_module("io_bytes")
    common = bench_module("common")
    fake = tmp_path / "ncu"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        args = sys.argv[1:]
        assert args[:2] == ["--clock-control", "none"] and "--csv" in args, args
        kernel, n = args[args.index("--child") + 1], int(args[args.index("--child") + 2])
        print({HEADER!r})
        launches = 3 if kernel == "naive" else 1
        per = 16 * n * n if kernel == "naive" else 256 * n  # per launch
        for i in range(launches):
            for metric in ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"):
                print(f'"{{i}}","1","p","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","s",'
                      f'"{{metric}}","byte","{{per:,.0f}}"')
        """))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    assert io_bytes.main(["--ncu", str(fake), "--seqlens", "512,2048", "--out-dir", str(out)]) == 0
    rows = common.read_csv(out / "io_bytes.csv")
    assert [(r["kernel"], r["seqlen"], r["kernels"]) for r in rows] == [
        ("naive", "512", "3"), ("naive", "2048", "3"), ("flash", "512", "1"), ("flash", "2048", "1")]
    naive = [r for r in rows if r["kernel"] == "naive"]
    assert float(naive[1]["dram__bytes_read.sum"]) == 3 * 16 * 2048 ** 2
    for r in rows:  # the fitted models pass near the points (within the models' shape error)
        ratio = float(r["model_dram__bytes_read.sum"]) / float(r["dram__bytes_read.sum"])
        assert 0.1 < ratio < 10, r
    if importlib.util.find_spec("matplotlib"):
        assert (out / "io_bytes.png").read_bytes()[:4] == b"\x89PNG"


def test_child_forward_matches_reference(bench_module):
    """What the child runs under ncu: one forward of each kernel on host-made inputs."""
    io_bytes = bench_module("io_bytes")
    n, d, b = 6, 16, 1
    rng = np.random.default_rng(0)  # run_once draws q, k, v in this order
    q, k, v = (rng.standard_normal((b, n, 1, d), dtype=np.float32).astype(np.float16)
               for _ in range(3))
    ro, rl = ref.attention_fwd_ref(q, k, v)
    for kernel in io_bytes.KERNELS:
        out, lse = io_bytes.run_once(kernel, n, d, b)
        assert np.abs(to_host(out).astype(np.float64) - ro).max() < 2e-3, kernel
        assert np.abs(to_host(lse) - rl).max() < 1e-4, kernel


def test_no_bench_dir_in_child_env(bench_module):
    """The command line runs this very script in the child."""
    io_bytes = bench_module("io_bytes")
    args = io_bytes.parse_args(["--head-dim", "128", "--batch", "3"])
    cmd = io_bytes.ncu_command("ncu", "flash", 4096, args)
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert cmd[cmd.index("--metrics") + 1] == ",".join(io_bytes.METRICS)
    assert os.path.samefile(cmd[cmd.index("--child") - 1], io_bytes.__file__)
    assert cmd[cmd.index("--child"):] == ["--child", "flash", "4096", "--head-dim", "128",
                                          "--batch", "3", "--heads", "1"]
