"""Shared benchmark plumbing: FLOP/byte formulas, timing, result folders, CSV and tables.

Method (docs/design.md): every provider is checked for correctness first, then timed with CUDA events
after a warm-up, taking the median of many runs, on inputs larger than the L2 cache. Results go to
``bench/results/<gpu>/`` with the date, GPU, commit and command recorded beside the CSV.
"""

import csv
import datetime
import os
import pathlib
import subprocess
import sys

# Probe calls and small problems launch few blocks; Numba's low-occupancy warning for each of
# them buried the benchmark logs. Set before Numba is imported (the scripts import it later).
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

RESULTS = pathlib.Path(__file__).parent / "results"


# ----------------------------------------------------------------------------- formulas

def attention_flops(batch, heads_q, seqlen_q, seqlen_k, head_dim, causal, mode="fwd"):
    """FLOPs of exact attention: 4 B Hq Sq Sk D forward (two matmuls), halved when causal;
    the backward does 2.5x the forward's (five matmuls instead of two)."""
    f = 4.0 * batch * heads_q * seqlen_q * seqlen_k * head_dim
    if causal:
        f *= 0.5
    return f * (2.5 if mode == "bwd" else 1.0)


def mla_decode_flops(b, s_q, h_q, d, dv, mean_seqlen):
    return b * h_q * s_q * (2.0 * d + 2.0 * dv) * mean_seqlen


def mla_decode_bytes(b, s_q, h_q, h_kv, d, dv, mean_seqlen, elem=2):
    """Fewest bytes a decode must move: q once, the latent cache once, out once."""
    return b * (s_q * h_q * d + mean_seqlen * h_kv * d + s_q * h_q * dv) * elem


# ----------------------------------------------------------------------------- timing

def time_ms(fn, warmup_ms=100, rep_ms=200):
    """Median milliseconds of ``fn()`` measured with CUDA events (triton.testing.do_bench),
    after ``warmup_ms`` of untimed runs (long enough for the clock to come up from idle)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


# ----------------------------------------------------------------------------- the project's Triton kernels

TRITON_DIR = pathlib.Path(__file__).parent / "triton_kernels"


def triton_module(name):
    """``bench/triton_kernels/<name>.py`` imported as the module ``name`` (e.g. ``flash_fwd``).

    The folder itself goes on ``sys.path``, so its modules import each other by file name. Its
    name is not ``triton``: with bench/ on ``sys.path`` (every script run from there, the bench
    tests) a folder of that name is found as a namespace package wherever Triton is not
    installed, and torch then takes it for Triton.
    """
    import importlib

    if str(TRITON_DIR) not in sys.path:
        sys.path.insert(0, str(TRITON_DIR))
    return importlib.import_module(name)


# ----------------------------------------------------------------------------- results

def gpu_name():
    try:
        import torch

        return torch.cuda.get_device_name().replace(" ", "-")
    except Exception:
        return "cpu"


def git_commit():
    """The commit benchmarked: $NF_BENCH_COMMIT when set (the GPU machine gets a copy of the
    tree without git), else git's HEAD."""
    if os.environ.get("NF_BENCH_COMMIT"):
        return os.environ["NF_BENCH_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=pathlib.Path(__file__).parent).strip()
    except Exception:
        return "unknown"


def results_dir(out_dir=None):
    """``bench/results/<gpu>/`` (``gpu_name()``, e.g. ``NVIDIA-H200``; created), or ``out_dir``
    when given. One folder per GPU: a new run replaces the file of the same name there, and the
    CSV header records its date, commit and command."""
    if out_dir is None:
        out_dir = RESULTS / gpu_name()
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def write_csv(path, rows):
    """Rows (dicts with the same keys) -> CSV, with a commented header naming date, GPU, commit
    and the command that produced them."""
    path = pathlib.Path(path)
    with path.open("w", newline="") as f:
        f.write(f"# date: {datetime.datetime.now().isoformat(timespec='seconds')}\n")
        f.write(f"# gpu: {gpu_name()}\n# commit: {git_commit()}\n")
        f.write(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}\n")
        if rows:
            fields = list(dict.fromkeys(key for row in rows for key in row))  # first-seen order
            w = csv.DictWriter(f, fieldnames=fields, restval="")
            w.writeheader()
            w.writerows(rows)
    return path


def read_csv(path):
    with pathlib.Path(path).open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def format_table(rows, columns):
    """Plain-text table of ``rows`` (dicts) over ``columns``."""
    cells = [[str(c) for c in columns]] + [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def rotated(names, rnd):
    """The providers in the order of round ``rnd`` of a point: every round starts one provider
    further on, so a drift of the GPU's clock during the point reaches every provider alike
    instead of whichever happens to be timed last."""
    shift = rnd % len(names) if names else 0
    return names[shift:] + names[:shift]


class Progress:
    """A one-line progress bar on stderr (no dependency), e.g. ``[ 7/24] fwd fp16 D=64 N=4096``."""

    def __init__(self, total):
        self.total, self.done = total, 0

    def step(self, label):
        self.done += 1
        end = "\n" if self.done == self.total or not sys.stderr.isatty() else ""
        sys.stderr.write(f"\r[{self.done:>{len(str(self.total))}}/{self.total}] {label:<60}{end}")
        sys.stderr.flush()


# ----------------------------------------------------------------------------- plots

def plot_panels(path, rows, x, y, panels, line, xlabel, ylabel, title, hline=None, logy=False):
    """PNG of ``y`` against ``x`` (log2 x axis; log y with ``logy``): one panel per distinct
    value of the ``panels`` keys, one line per distinct ``line`` value, points with a missing or
    NaN ``y`` left out; ``hline`` = (value, label) draws a dashed reference line on every panel.
    Returns the path, or None (with a note on stderr) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write(f"matplotlib not installed: no plot {pathlib.Path(path).name}\n")
        return None
    keys = list(dict.fromkeys(tuple(r[k] for k in panels) for r in rows))
    cols = min(len(keys), 4)
    nrows = -(-len(keys) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        sub = [r for r in rows if tuple(r[k] for k in panels) == key and _number(r.get(y))]
        for name in dict.fromkeys(r[line] for r in sub):
            pts = sorted((float(r[x]), float(r[y])) for r in sub if r[line] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        if hline:
            ax.axhline(hline[0], color="gray", linestyle="--", label=hline[1])
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(panels, key)), fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return pathlib.Path(path)


def _number(v):
    try:
        return v not in ("", None) and float(v) == float(v)
    except (TypeError, ValueError):
        return False
