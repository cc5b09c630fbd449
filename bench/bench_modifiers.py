"""Score-modifier benchmark: numba_flash's forward and backward with a softcap, ALiBi slopes or
learnable sinks, each against the same call without it (the issue's targets: softcap and ALiBi
<= 1.10x the plain call's time forward, <= 1.15x backward; a sink <= 1.03x).

    python bench/bench_modifiers.py              # N 4k and 16k, D 64 / 128, bf16, causal
    python bench/bench_modifiers.py --modes bwd --seqlens 4096 --head-dims 128 --causal 0

Each point is B = tokens / N sequences of N tokens (32k tokens, Hq * D = 2048, Hk = Hq), fresh
inputs from a seeded generator. Providers, all ``numba_flash.flash_attn_fwd`` / ``_bwd`` with
``backend="auto"`` (the tc kernels):
    plain     no option
    softcap   softcap=30 (Gemma-2's)
    alibi     alibi_slopes (Hq,), BLOOM's geometric slopes 2^(-8 h / Hq)
    sink      learnable_sink (Hq,) (gpt-oss's); the backward adds dsink's kernel
Every option's output (forward) or dq (backward) is checked first against PyTorch's SDPA in
float32 with the same modification written out (scores capped, biased, a sink column), on a
slice of the batch. Columns: ms (median of --repeats alternating rounds), TFLOP/s (the plain
call's count of pairs) and the ratio of each option's time to plain's. Results:
modifiers.csv and modifiers.png in bench/results/<gpu>/.
"""

import argparse
import statistics
import sys

import common

OPTIONS = ("plain", "softcap", "alibi", "sink")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--causal", default="1", help="comma-separated 0/1")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def option_kwargs(name, heads, device):
    """The keyword arguments of option ``name`` for ``heads`` query heads."""
    import torch

    if name == "softcap":
        return dict(softcap=30.0)
    if name == "alibi":
        h = torch.arange(1, heads + 1, device=device, dtype=torch.float32)
        return dict(alibi_slopes=torch.exp2(-8.0 * h / heads))
    if name == "sink":
        g = torch.Generator(device=device).manual_seed(1)
        return dict(learnable_sink=torch.randn(heads, device=device, generator=g))
    return {}


def reference_out(q, k, v, causal, kwargs):
    """float32 attention of the first sequence with the option written out."""
    import torch

    q, k, v = (x[:1].float().transpose(1, 2) for x in (q, k, v))  # (1, H, N, D)
    n = q.shape[2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if "softcap" in kwargs:
        s = kwargs["softcap"] * torch.tanh(s / kwargs["softcap"])
    i = torch.arange(n, device=q.device)
    if "alibi_slopes" in kwargs:
        s = s - kwargs["alibi_slopes"][:, None, None] * (i[:, None] - i[None, :]).abs()
    if causal:
        s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    if "learnable_sink" in kwargs:
        sink = kwargs["learnable_sink"][:, None, None].expand(-1, n, 1)
        p = torch.cat([s, sink[None]], dim=-1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    return (p @ v).transpose(1, 2)


def main(argv=None):
    import torch
    import numba_flash as nf

    args = parse_args(argv)
    points = [(m, dt, c, d, n) for m in args.modes.split(",") for dt in args.dtypes.split(",")
              for c in map(int, args.causal.split(","))
              for d in map(int, args.head_dims.split(","))
              for n in map(int, args.seqlens.split(","))]
    progress = common.Progress(len(points))
    rows, out_dir = [], common.results_dir(args.out_dir)
    for mode, dtype, causal, d, n in points:
        causal = bool(causal)
        heads, b = args.hidden // d, args.tokens // n
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        q, k, v, dout = (torch.randn(b, n, heads, d, device="cuda", generator=g,
                                     dtype=getattr(torch, dtype)) for _ in range(4))
        timers = {}
        for name in OPTIONS:
            kw = option_kwargs(name, heads, "cuda")
            out, lse = nf.flash_attn_fwd(q, k, v, causal=causal, **kw)
            if mode == "fwd":
                if n <= 4096:  # the float32 reference holds H N^2 scores
                    err = (out[:1].float() - reference_out(q, k, v, causal, kw)).abs().max()
                    if not err.item() <= 2e-2:
                        print(f"  {name}: differs from the reference by {err.item():.3g}; "
                              f"left out", flush=True)
                        continue
                call = (lambda kw=kw: nf.flash_attn_fwd(q, k, v, causal=causal, **kw))
            else:
                call = (lambda kw=kw, out=out, lse=lse: nf.flash_attn_bwd(
                    dout, q, k, v, out, lse, causal=causal, **kw))
            timers[name] = lambda call=call: common.time_ms(call)
        samples = {name: [] for name in timers}
        for rnd in range(args.repeats):
            for name in common.rotated(list(timers), rnd):
                samples[name].append(timers[name]())
        flops = common.attention_flops(b, heads, n, n, d, causal, mode)
        point = [dict(mode=mode, dtype=dtype, causal=causal, head_dim=d, seqlen=n, option=name,
                      ms=statistics.median(ms), tflops=flops / statistics.median(ms) / 1e9)
                 for name, ms in samples.items()]
        plain = next((r["ms"] for r in point if r["option"] == "plain"), float("nan"))
        for r in point:
            r["time_vs_plain"] = r["ms"] / plain
        rows += point
        common.write_csv(out_dir / "modifiers.csv", rows)
        progress.step(f"{mode} {dtype} causal={causal} D={d} N={n}: " + ", ".join(
            f"{r['option']} {r['time_vs_plain']:.3f}x" for r in point))
        torch.cuda.empty_cache()
    print(common.format_table(rows, ["mode", "dtype", "causal", "head_dim", "seqlen", "option",
                                     "ms", "tflops", "time_vs_plain"]))
    if not args.no_plot:
        common.plot_panels(out_dir / "modifiers.png", rows, "seqlen", "time_vs_plain",
                           ("mode", "causal", "head_dim"), "option", "N",
                           "time / the plain call's", f"{args.tokens} tokens, {args.dtypes}",
                           hline=(1.0, "plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
