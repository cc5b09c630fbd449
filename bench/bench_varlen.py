"""Varlen attention benchmark: numba_flash's varlen calls against torch's varlen_attn (FA2's
varlen kernels) and against numba_flash's dense kernel at equal total tokens.

    python bench/bench_varlen.py                       # fwd and bwd, bfloat16, D 64/128, causal both
    python bench/bench_varlen.py --modes fwd --repeats 5

Batch: random sequence lengths uniform in [--min-len, --max-len] (seeded) packed to --tokens
rows, Hq * D = --hidden, one kv head per query head. Providers:
    nf-varlen      numba_flash.flash_attn_varlen_fwd / _bwd (auto backend: the tc kernels)
    torch-varlen   torch.nn.attention.varlen.varlen_attn; backward through autograd
    nf-dense       numba_flash.flash_attn_fwd / _bwd on B equal sequences of the mean length
                   (the same total tokens): what packing costs against a padded-free dense batch
    nf-paged-P     flash_attn_varlen_fwd with K and V in shuffled pages of P rows behind a
                   block table (--pages, forward only, as flash-attn's paged varlen)
Every provider's output is first compared with nf-varlen's on the same inputs (nf-dense's first
sequence with a varlen call of that sequence). TFLOP/s count the visible pairs: 4 Hq D L^2 per
sequence forward, halved when causal, 2.5x that backward; the ratio column is TFLOP/s over
torch-varlen's, vs_nf-varlen over the unpaged call's. Rounds alternate the providers (the median of
--repeats rounds per provider). Results: varlen.csv and varlen.png in bench/results/<gpu>/.
"""

import argparse
import inspect
import itertools
import statistics
import sys

import common

ANCHOR = "torch-varlen"


def lengths(tokens, lo, hi, seed):
    """Random lengths in [lo, hi] summing to ``tokens`` (the last one cut to fit)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    while sum(out) < tokens:
        out.append(int(rng.integers(lo, hi + 1)))
    out[-1] -= sum(out) - tokens
    if out[-1] < lo and len(out) > 1:
        out[-2] += out.pop()
    return out


def varlen_flops(lens, heads, d, causal, mode):
    return sum(common.attention_flops(1, heads, n, n, d, causal, mode) for n in lens)


def _torch_varlen():
    import torch
    from torch.nn.attention import varlen

    takes_causal = "is_causal" in inspect.signature(varlen.varlen_attn).parameters

    def fwd(q, k, v, cu, max_len, causal):
        mask = dict(is_causal=causal) if takes_causal else \
            dict(window_size=(-1, 0) if causal else (-1, -1))
        return varlen.varlen_attn(q, k, v, cu, cu, max_len, max_len, **mask)

    def bwd(q, k, v, dout, cu, max_len, causal):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = fwd(q, k, v, cu, max_len, causal)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return fwd, bwd


def _nf_varlen():
    import numba_flash as nf

    def fwd(q, k, v, cu, max_len, causal):
        return nf.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)

    def bwd(q, k, v, dout, cu, max_len, causal):
        out, lse = nf.flash_attn_varlen_fwd(q, k, v, cu, cu, max_len, max_len, causal=causal)
        return lambda: nf.flash_attn_varlen_bwd(dout, q, k, v, out, lse, cu, cu, max_len,
                                                max_len, causal=causal)

    return fwd, bwd


def paginate(x, lens, page, seed):
    """Packed rows ``x`` (tokens, H, D) of sequences ``lens`` as (pages, table): each
    sequence's rows from a page of its own, zero-padded to whole pages, the pages in a seeded
    random order, and the block table (B, max pages) int32 that names them."""
    import torch

    counts = [-(-n // page) for n in lens]
    parts = []
    for n, start, c in zip(lens, itertools.accumulate([0] + lens), counts):
        part = x.new_zeros(c * page, *x.shape[1:])
        part[:n] = x[start:start + n]
        parts.append(part.view(c, page, *x.shape[1:]))
    order = torch.randperm(sum(counts), generator=torch.Generator().manual_seed(seed))
    pages = torch.empty_like(torch.cat(parts))
    pages[order.to(x.device)] = torch.cat(parts)
    table = torch.zeros(len(lens), max(counts), dtype=torch.int32)
    for i, first in enumerate(itertools.accumulate([0] + counts[:-1])):
        table[i, :counts[i]] = order[first:first + counts[i]]
    return pages, table.to(x.device)


def _nf_paged(page, lens, seed):
    """The forward over K and V in pages (``paginate``, made once per input on the first call:
    the correctness check, untimed)."""
    import numba_flash as nf

    made = {}

    def fwd(q, k, v, cu, max_len, causal):
        key = (k.data_ptr(), v.data_ptr())
        if key not in made:
            (k_pages, table), (v_pages, _) = (paginate(x, lens, page, seed) for x in (k, v))
            made.clear()
            made[key] = k_pages, v_pages, table
        k_pages, v_pages, table = made[key]
        return nf.flash_attn_varlen_func(q, k_pages, v_pages, cu, cu, max_len, max_len,
                                         causal=causal, block_table=table)

    return fwd, None


def _nf_dense(batch, n):
    import numba_flash as nf

    def shaped(*xs):
        return [x.view(batch, n, *x.shape[1:]) for x in xs]

    def fwd(q, k, v, cu, max_len, causal):
        return nf.flash_attn_func(*shaped(q, k, v), causal=causal)

    def bwd(q, k, v, dout, cu, max_len, causal):
        q, k, v, dout = shaped(q, k, v, dout)
        out, lse = nf.flash_attn_fwd(q, k, v, causal=causal)
        return lambda: nf.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal)

    return fwd, bwd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--causal", choices=["both", "0", "1"], default="both")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--pages", default="16,64", help="page sizes of the nf-paged providers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def main(argv=None):
    import torch

    args = parse_args(argv)
    lens = lengths(args.tokens, args.min_len, args.max_len, args.seed)
    mean = round(args.tokens / len(lens) / 64) * 64
    dense_batch = args.tokens // mean
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    max_len = max(lens)
    print(f"{len(lens)} sequences, lengths {min(lens)}..{max_len}, mean "
          f"{args.tokens / len(lens):.0f}; nf-dense: {dense_batch} x {mean}", flush=True)
    providers = {"nf-varlen": _nf_varlen(), "torch-varlen": _torch_varlen(),
                 "nf-dense": _nf_dense(dense_batch, mean)}
    for page in filter(None, args.pages.split(",")):
        providers[f"nf-paged-{page}"] = _nf_paged(int(page), lens, args.seed)
    causal_list = [False, True] if args.causal == "both" else [args.causal == "1"]
    points = [(m, dt, d, c) for m in args.modes.split(",") for dt in args.dtypes.split(",")
              for d in map(int, args.head_dims.split(",")) for c in causal_list]
    rows, out_dir = [], common.results_dir(args.out_dir)
    for i, (mode, dtype, d, causal) in enumerate(points):
        heads = args.hidden // d
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        q, k, v, dout = (torch.randn(args.tokens, heads, d, device="cuda", generator=g,
                                     dtype=getattr(torch, dtype)) for _ in range(4))
        ref = providers["nf-varlen"][0](q, k, v, cu, max_len, causal).float()
        timers = {}
        for name, (fwd, bwd) in providers.items():
            if mode == "bwd" and bwd is None:
                continue
            n_tokens = dense_batch * mean if name == "nf-dense" else args.tokens
            x = [t[:n_tokens] for t in (q, k, v, dout)]
            out = fwd(*x[:3], cu, max_len, causal).float().reshape(n_tokens, heads, d)
            if name == "nf-dense":  # its first sequence against a varlen call of one sequence
                one = torch.tensor([0, mean], dtype=torch.int32, device="cuda")
                want = providers["nf-varlen"][0](*[t[:mean] for t in x[:3]], one, mean, causal)
                err = (out[:mean] - want.float()).abs().max().item()
            else:
                err = (out - ref).abs().max().item()
            if not err <= 2e-2:
                print(f"  {name}: differs from nf-varlen by {err:.3g}; left out", flush=True)
                continue
            run = (lambda f=fwd, x=x: f(*x[:3], cu, max_len, causal)) if mode == "fwd" else \
                bwd(*x, cu, max_len, causal)
            timers[name] = (lambda run=run: common.time_ms(run))
        samples = {name: [] for name in timers}
        for rnd in range(args.repeats):
            for name in common.rotated(list(timers), rnd):
                samples[name].append(timers[name]())
        point = []
        for name, ms in samples.items():
            ms = statistics.median(ms)
            flops = varlen_flops([mean] * dense_batch if name == "nf-dense" else lens, heads, d,
                                 causal, mode)
            point.append(dict(mode=mode, dtype=dtype, head_dim=d, causal=int(causal),
                              provider=name, ms=ms, tflops=flops / ms / 1e9))
        # TFLOP/s ratios: nf-dense does other work (equal sequences) in the same tokens
        for name in (ANCHOR, "nf-varlen"):
            anchor = next((r["tflops"] for r in point if r["provider"] == name), float("nan"))
            for r in point:
                r["vs_" + name] = r["tflops"] / anchor
        rows += point
        common.write_csv(out_dir / "varlen.csv", rows)
        print(f"[{i + 1}/{len(points)}] {mode} {dtype} D={d} causal={int(causal)}: " + ", ".join(
            f"{r['provider']} {r['tflops']:.0f} TFLOP/s" for r in point),
            flush=True)
    print(common.format_table(rows, ["mode", "dtype", "head_dim", "causal", "provider", "ms",
                                     "tflops", "vs_" + ANCHOR, "vs_nf-varlen"]))
    if not args.no_plot:
        plot(rows, out_dir / "varlen.png")
    return 0


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(dict.fromkeys((r["mode"], r["dtype"], r["head_dim"], r["causal"])
                                for r in rows))
    names = list(dict.fromkeys(r["provider"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(points)), 4))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        ys = [next((r["tflops"] for r in rows if r["provider"] == name and
                    (r["mode"], r["dtype"], r["head_dim"], r["causal"]) == p), 0) for p in points]
        ax.bar([i + j * width for i in range(len(points))], ys, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(points))])
    ax.set_xticklabels([f"{m}\nD={d}{' c' if c else ''}" for m, _, d, c in points])
    ax.set_ylabel("TFLOP/s (visible pairs)")
    ax.set_title(f"varlen attention, {rows[0]['dtype']}, {common.gpu_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
