"""Sliding-window attention benchmark: numba_flash's forward and backward with ``window_size=(W,
0)`` (causal, the window Mistral and Gemma's local layers use) against torch's varlen_attn with
the same window (FA2's kernels on the H200 image) and against numba_flash's causal calls without
one.

    python bench/bench_window.py           # W 1024, N 4k and 16k, D 64 / 128, both dtypes
    python bench/bench_window.py --modes bwd --seqlens 16384 --head-dims 128 --dtypes bfloat16

Each point is B = tokens / N sequences of N tokens (32k tokens, Hq * D = 2048, Hk = Hq). TFLOP/s
count the pairs each call computes: query i sees min(i, W) + 1 keys with the window, i + 1 without
(4 D flops per pair forward, 2.5x that backward), so the window's TFLOP/s are comparable to the
causal call's: a kernel whose cost follows the visible pairs keeps the same rate. Providers:
    nf-window     numba_flash.flash_attn_fwd / _bwd(..., causal=True, window_size=(W, 0))
    torch-window  torch.nn.attention.varlen.varlen_attn(..., window_size=(W, 0)) on the packed
                  rows; backward through autograd
    nf-causal     numba_flash.flash_attn_fwd / _bwd(..., causal=True), no window
Every windowed provider's output (forward) or dq (backward) is compared with nf-window's first.
Columns: ms (median of --repeats alternating rounds), TFLOP/s, and the ratios to torch-window
and nf-causal. Results: window.csv and window.png in bench/results/<gpu>/.
"""

import argparse
import inspect
import statistics
import sys

import common


def visible_pairs(n, left):
    """Pairs (i, j) with i - left <= j <= i of one sequence of n tokens (left -1: causal)."""
    if left < 0 or left >= n:
        return n * (n + 1) // 2
    return (left + 1) * (left + 2) // 2 + (n - left - 1) * (left + 1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--window", type=int, default=1024, help="left side W; the right side is 0")
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def providers(window):
    """name -> (forward(q, k, v, cu, n) -> out, backward(q, k, v, dout, cu, n) -> a call that
    returns (dq, dk, dv))."""
    import torch
    import numba_flash as nf
    from torch.nn.attention import varlen

    def nf_calls(window_size):
        def fwd(q, k, v, cu, n):
            return nf.flash_attn_fwd(q, k, v, causal=True, window_size=window_size)[0]

        def bwd(q, k, v, dout, cu, n):
            out, lse = nf.flash_attn_fwd(q, k, v, causal=True, window_size=window_size)
            return lambda: nf.flash_attn_bwd(dout, q, k, v, out, lse, causal=True,
                                             window_size=window_size)
        return fwd, bwd

    def torch_fwd(q, k, v, cu, n):
        b = q.shape[0]
        flat = [x.reshape(b * n, *x.shape[2:]) for x in (q, k, v)]
        out = varlen.varlen_attn(*flat, cu, cu, n, n, window_size=(window, 0))
        return out.reshape(q.shape)

    def torch_bwd(q, k, v, dout, cu, n):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = torch_fwd(q, k, v, cu, n)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    found = {"nf-window": nf_calls((window, 0)), "nf-causal": nf_calls((-1, -1))}
    if "window_size" in inspect.signature(varlen.varlen_attn).parameters:
        found["torch-window"] = (torch_fwd, torch_bwd)
    else:
        print("torch's varlen_attn takes no window_size: torch-window left out", flush=True)
    return found


def main(argv=None):
    import torch

    args = parse_args(argv)
    runs = providers(args.window)
    points = [(m, dt, d, n) for m in args.modes.split(",") for dt in args.dtypes.split(",")
              for d in map(int, args.head_dims.split(","))
              for n in map(int, args.seqlens.split(","))]
    progress = common.Progress(len(points))
    rows, out_dir = [], common.results_dir(args.out_dir)
    for mode, dtype, d, n in points:
        heads, b = args.hidden // d, args.tokens // n
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        q, k, v, dout = (torch.randn(b, n, heads, d, device="cuda", generator=g,
                                     dtype=getattr(torch, dtype)) for _ in range(4))
        cu = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")

        def result(name):  # the forward's out, or the backward's dq
            fwd, bwd = runs[name]
            return (fwd(q, k, v, cu, n) if mode == "fwd" else bwd(q, k, v, dout, cu, n)()[0])

        want = result("nf-window").float()
        timers = {}
        for name, (fwd, bwd) in runs.items():
            if name != "nf-causal":
                err = (result(name).float() - want).abs().max().item()
                if not err <= 5e-2:
                    print(f"  {name}: differs from nf-window by {err:.3g}; left out", flush=True)
                    continue
            call = (lambda fwd=fwd: fwd(q, k, v, cu, n)) if mode == "fwd" else \
                bwd(q, k, v, dout, cu, n)
            timers[name] = lambda call=call: common.time_ms(call)
        samples = {name: [] for name in timers}
        for rnd in range(args.repeats):
            for name in common.rotated(list(timers), rnd):
                samples[name].append(timers[name]())
        point = []
        for name, ms in samples.items():
            ms = statistics.median(ms)
            pairs = visible_pairs(n, -1 if name == "nf-causal" else args.window)
            flops = 4 * d * heads * b * pairs * (2.5 if mode == "bwd" else 1.0)
            point.append(dict(mode=mode, dtype=dtype, head_dim=d, seqlen=n, window=args.window,
                              provider=name, ms=ms, tflops=flops / ms / 1e9))
        for anchor in ("torch-window", "nf-causal"):
            base = next((r["tflops"] for r in point if r["provider"] == anchor), float("nan"))
            for r in point:
                r["vs_" + anchor] = r["tflops"] / base
        rows += point
        common.write_csv(out_dir / "window.csv", rows)
        progress.step(f"{mode} {dtype} D={d} N={n}: " + ", ".join(
            f"{r['provider']} {r['tflops']:.0f}" for r in point) + " TFLOP/s")
        torch.cuda.empty_cache()
    print(common.format_table(rows, ["mode", "dtype", "head_dim", "seqlen", "provider", "ms",
                                     "tflops", "vs_torch-window", "vs_nf-causal"]))
    if not args.no_plot:
        common.plot_panels(out_dir / "window.png", rows, "seqlen", "tflops",
                           ("mode", "dtype", "head_dim"), "provider", "N",
                           "TFLOP/s (visible pairs)",
                           f"causal, window ({args.window}, 0), {args.tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
