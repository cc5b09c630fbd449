"""Measured global-memory traffic of the naive and the flash (SIMT) forward, against chapter 9.4.1.

    python bench/io_bytes.py                         # N = 512 .. 16k, one head, D = 64, batch 2
    python bench/io_bytes.py --seqlens 1024,4096 --batch 1

The chapter's claim: the three-kernel attention moves Theta(N d + N^2) bytes between the SMs and
memory (S and P make the round trip), FlashAttention Theta(N^2 d^2 / M) with M the on-chip
memory a block works in. This script measures both with Nsight Compute. Each (kernel, N) runs
once in a child process of this script under

    ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
        --csv --print-units base python bench/io_bytes.py --child <kernel> <N> ...

and the metrics of every kernel the child launched are summed (the naive forward launches three,
the flash forward one; the child launches nothing else: its inputs are copied from the host).
dram__bytes_* is the traffic to HBM, the chapter's quantity, after the 50 MB L2 of an H100/H200
has absorbed the re-reads of K and V by the tiles of the flash kernel; lts__t_bytes is all the
traffic the L2 serves, which is what the chapter's model counts when the re-reads are not
absorbed. Both are plotted against the two models, each scaled by one constant (the geometric
mean of measured / model over the points) to the measurements: naive c (N d + N^2), flash
c N^2 d^2 / M with M the flash kernel's shared memory in float32 words.

Without ncu on PATH (or --ncu) the script says so and exits with status 0.
Results: io_bytes.csv and io_bytes.png in bench/results/<gpu>/.
"""

import argparse
import csv
import io
import math
import os
import pathlib
import shutil
import subprocess
import sys

import common

KERNELS = ("naive", "flash")
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum")
# Multipliers of the units ncu may print (it prints "byte" with --print-units base).
UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}


# ----------------------------------------------------------------------------- child side

def run_once(kernel, n, head_dim, batch, heads=1, fmt="float16", seed=0):
    """One forward of ``kernel`` ("naive" or "flash") on (batch, n, heads, head_dim) inputs made
    on the host and copied to the device; waits for it. Returns (out, lse)."""
    import numpy as np
    from numba import cuda

    import numba_flash as nf
    from numba_flash import api
    from numba_flash.runtime import arrays

    rng = np.random.default_rng(seed)
    dtype = arrays.numpy_dtype(fmt)
    q, k, v = (cuda.to_device(rng.standard_normal((batch, n, heads, head_dim), dtype=np.float32)
                              .astype(dtype)) for _ in range(3))
    if kernel == "naive":
        out = api.naive_attention(q, k, v)
    else:
        out = nf.flash_attn_fwd(q, k, v, backend="simt")
    cuda.synchronize()
    return out


# ----------------------------------------------------------------------------- ncu

def ncu_command(ncu, kernel, n, args):
    return [ncu, "--clock-control", "none", "--metrics", ",".join(args.metrics.split(",")),
            "--csv", "--print-units", "base", sys.executable, __file__, "--child", kernel, str(n),
            "--head-dim", str(args.head_dim), "--batch", str(args.batch), "--heads", str(args.heads)]


def parse_ncu_csv(text):
    """ncu's ``--csv`` output (the details page: one line per kernel launch and metric) ->
    {metric: total bytes over all launches}, plus "kernels": the number of launches. Lines before
    the CSV header (the program's output, ``==PROF==`` notes) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the output:\n"
                         + "\n".join(lines[-20:]))
    totals, launches = {}, set()
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("Metric Name"):
            continue
        unit = row["Metric Unit"].strip().lower()
        if unit not in UNITS:
            raise ValueError(f"unknown unit {row['Metric Unit']!r} of {row['Metric Name']}")
        value = float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        totals[row["Metric Name"]] = totals.get(row["Metric Name"], 0.0) + value
        launches.add(row["ID"])
    totals["kernels"] = len(launches)
    return totals


def measure(ncu, kernel, n, args):
    """{metric: bytes, "kernels": count} of one child run under ncu; raises with ncu's output
    when it fails."""
    env = dict(os.environ)  # the child imports numba_flash from this checkout
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(ncu_command(ncu, kernel, n, args), capture_output=True, text=True,
                          timeout=args.timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed (exit {proc.returncode}) for {kernel} N={n}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return parse_ncu_csv(proc.stdout)


# ----------------------------------------------------------------------------- models

def naive_model(n, head_dim):
    return n * head_dim + n * n


def flash_model(n, head_dim, m_words):
    return n * n * head_dim * head_dim / m_words


def fit_scale(measured, model):
    """The constant c minimising the squared log error of c * model against measured (the
    geometric mean of the ratios); NaN without positive points."""
    logs = [math.log(m / f) for m, f in zip(measured, model) if m > 0 and f > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def flash_shared_words(head_dim):
    """M of the chapter for the flash kernel: its shared memory, in float32 words."""
    from numba_flash.kernels.simt import forward

    config = forward.SPEC.Config(head_dim, False, "float32")
    return forward.SPEC.choose(config, None).shared_bytes // 4


def add_fits(rows, head_dim, m_words):
    """Each row gets model_<metric> (the fitted model of its kernel) for every measured metric."""
    metrics = [k for k in rows[0] if k.endswith(".sum") and not k.startswith("model_")]
    for kernel in KERNELS:
        sub = [r for r in rows if r["kernel"] == kernel]
        shape = [naive_model(r["seqlen"], head_dim) if kernel == "naive"
                 else flash_model(r["seqlen"], head_dim, m_words) for r in sub]
        for metric in metrics:
            c = fit_scale([r[metric] for r in sub], shape)
            for r, f in zip(sub, shape):
                r["model_" + metric] = c * f
    return rows


def plot(rows, path, head_dim, m_words):
    """Bytes against N (log-log), one panel per measured quantity: the measured points of both
    kernels and their fitted models."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("matplotlib not installed: no plot\n")
        return None
    panels = [("dram", ("dram__bytes_read.sum", "dram__bytes_write.sum"), "HBM (DRAM) bytes"),
              ("l2", ("lts__t_bytes.sum",), "L2 bytes served")]
    panels = [p for p in panels if all(m in rows[0] for m in p[1])]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    labels = {"naive": "naive: c (N d + N^2)", "flash": f"flash: c N^2 d^2 / M (M = {m_words} words)"}
    for ax, (_, metrics, title) in zip(axes.flat, panels):
        for kernel, color in zip(KERNELS, ("tab:red", "tab:blue")):
            sub = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["seqlen"])
            xs = [r["seqlen"] for r in sub]
            ax.plot(xs, [sum(r[m] for m in metrics) for r in sub], "o", color=color,
                    label=f"{kernel}, measured")
            ax.plot(xs, [sum(r["model_" + m] for m in metrics) for r in sub], "-", color=color,
                    alpha=0.6, label=labels[kernel])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("bytes")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"global-memory traffic of one forward, d = {head_dim}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--metrics", default=",".join(METRICS))
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute command line tool")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--child", nargs=2, metavar=("KERNEL", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.seqlen_list = [int(n) for n in args.seqlens.split(",")]
    args.kernel_list = args.kernels.split(",")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        run_once(args.child[0], int(args.child[1]), args.head_dim, args.batch, args.heads)
        return 0
    ncu = shutil.which(args.ncu)
    if ncu is None:
        print(f"{args.ncu}: Nsight Compute not found on PATH; nothing measured (install it or "
              f"pass --ncu /path/to/ncu)")
        return 0
    points = [(kernel, n) for kernel in args.kernel_list for n in args.seqlen_list]
    progress = common.Progress(len(points))
    out = common.results_dir(args.out_dir)
    rows, failed = [], []
    for kernel, n in points:
        progress.step(f"{kernel} N={n}")
        try:
            totals = measure(ncu, kernel, n, args)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            failed.append(f"{kernel} N={n}: {exc}")
            continue
        rows.append(dict(kernel=kernel, seqlen=n, head_dim=args.head_dim, batch=args.batch,
                         heads=args.heads, **totals))
        common.write_csv(out / "io_bytes.csv", rows)  # a cut-short run keeps what it measured
    for f in failed:
        sys.stderr.write(f + "\n")
    if not rows:
        return 1
    m_words = flash_shared_words(args.head_dim)
    add_fits(rows, args.head_dim, m_words)
    path = common.write_csv(out / "io_bytes.csv", rows)
    measured = [m for m in rows[0] if m.endswith(".sum") and not m.startswith("model_")]
    print(common.format_table(rows, ["kernel", "seqlen", "kernels"] + measured))
    print(f"wrote {path}")
    if not args.no_plot:
        png = plot(rows, out / "io_bytes.png", args.head_dim, m_words)
        if png:
            print(f"wrote {png}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
