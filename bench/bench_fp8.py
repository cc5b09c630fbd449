"""FP8 attention benchmark: numba_flash's e4m3 forward (FlashAttention-3's FP8) against its own
bfloat16 forward on the forward benchmark's grid plus head dim 256, with the GPU's FP8 and bf16
matmul rates as ceilings.

    python bench/bench_fp8.py                            # D 64/128/256, N 1k/4k/16k, causal 0/1
    python bench/bench_fp8.py --head-dims 128,256 --seqlens 4096,16384 --repeats 3

Each point: B * N = --tokens, Hq = Hk = --hidden / D, inputs N(0, 1) in bfloat16; the FP8
provider's q, k, v are those rounded by ``numba_flash.quantize_fp8`` (one descale per batch and
head, outside the timing). Providers:
    nf-bf16   numba_flash.flash_attn_fwd on the bfloat16 inputs (backend "tc")
    nf-fp8    numba_flash.flash_attn_fwd on the e4m3 inputs with their descales, out bfloat16
Before any timing, each provider runs a small point of each configuration, checked against the
float64 attention of the values it was given (the dequantized ones for nf-fp8): bf16 within
2e-2, FP8 within 6e-2 (e4m3 keeps 3 mantissa bits; the tests hold the kernel to FA3's rule).
Columns: ms (median of --repeats alternating rounds), tflops (4 B H N^2 D, halved when causal,
over the time), vs_bf16 = nf-fp8's rate over nf-bf16's at the point, max_err of the check. The
ceilings (rows with provider "matmul-*") time torch._scaled_mm on 8192^3 e4m3 and torch.matmul on
8192^3 bfloat16. Results: fp8.csv and fp8.png in bench/results/<gpu>/.
"""

import argparse
import statistics
import sys

import common

CHECK_TOKENS = 1024  # the correctness check's point: one sequence of this length
ATOL = {"nf-bf16": 2e-2, "nf-fp8": 6e-2}
MATMUL = 8192


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", default="64,128,256")
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--causal", choices=["both", "0", "1"], default="both")
    p.add_argument("--tokens", type=int, default=32768, help="B * N")
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds per point")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    args.head_dim_list = [int(x) for x in args.head_dims.split(",")]
    args.seqlen_list = [int(x) for x in args.seqlens.split(",")]
    args.causal_list = [False, True] if args.causal == "both" else [args.causal == "1"]
    return args


def make_inputs(b, n, h, d, seed=0):
    """bfloat16 q, k, v (B, N, H, D) and their FP8 forms: {"bf16": (q, k, v), "fp8": (q8, k8,
    v8, q_descale, k_descale, v_descale)}."""
    import torch

    import numba_flash as nf

    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = [torch.randn(b, n, h, d, device="cuda", generator=g, dtype=torch.bfloat16)
           for _ in range(3)]
    quantized = [nf.quantize_fp8(x) for x in qkv]
    return {"bf16": tuple(qkv), "fp8": (*(x for x, _ in quantized), *(s for _, s in quantized))}


def run(provider, inputs, causal):
    import numba_flash as nf

    if provider == "nf-bf16":
        return nf.flash_attn_fwd(*inputs["bf16"], causal=causal, backend="tc")[0]
    q8, k8, v8, qd, kd, vd = inputs["fp8"]
    return nf.flash_attn_fwd(q8, k8, v8, causal=causal, backend="tc", q_descale=qd,
                             k_descale=kd, v_descale=vd)[0]


def attended_values(provider, inputs):
    """float64 q, k, v of what ``provider`` attends with (FP8: stored values times descales)."""
    if provider == "nf-bf16":
        return [x.double() for x in inputs["bf16"]]
    q8, k8, v8, *descales = inputs["fp8"]
    return [x.double() * s.double()[:, None, :, None] for x, s in zip((q8, k8, v8), descales)]


def check(provider, d, causal):
    """max |out - float64 attention| on a (1, CHECK_TOKENS, 2, d) point."""
    import torch

    inputs = make_inputs(1, CHECK_TOKENS, 2, d, seed=1)
    q, k, v = attended_values(provider, inputs)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * d ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(CHECK_TOKENS, CHECK_TOKENS, dtype=torch.bool,
                                     device="cuda").triu(1), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)
    return (run(provider, inputs, causal).double() - ref).abs().max().item()


def matmul_ceilings():
    """Rows of the FP8 (torch._scaled_mm) and bf16 (torch.matmul) 8192^3 matmul rates."""
    import torch

    a = torch.randn(MATMUL, MATMUL, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL, MATMUL, device="cuda", dtype=torch.bfloat16)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # b column-major
    one = torch.ones((), device="cuda")
    flops = 2.0 * MATMUL ** 3
    rows = []
    for name, fn in (("matmul-fp8", lambda: torch._scaled_mm(a8, b8, one, one,
                                                              out_dtype=torch.bfloat16)),
                     ("matmul-bf16", lambda: a @ b)):
        ms = common.time_ms(fn)
        rows.append(dict(provider=name, head_dim=MATMUL, seqlen=MATMUL, ms=ms,
                         tflops=flops / ms * 1e-9))
    return rows


def main(argv=None):
    args = parse_args(argv)
    import torch

    providers = ["nf-bf16", "nf-fp8"]
    points = [(d, n, c) for d in args.head_dim_list for c in args.causal_list
              for n in args.seqlen_list]
    out = common.results_dir(args.out_dir)
    path = out / "fp8.csv"
    configs = sorted({(d, c) for d, _, c in points})
    progress = common.Progress(len(configs) * len(providers))
    errors = {}
    for d, c in configs:  # compiles every kernel before any timing
        for name in providers:
            progress.step(f"check D={d} causal={int(c)} {name}")
            errors[name, d, c] = check(name, d, c)
    rows = matmul_ceilings()
    progress = common.Progress(len(points) * len(providers) * args.repeats)
    for d, n, c in points:
        b, h = max(args.tokens // n, 1), args.hidden // d
        inputs = make_inputs(b, n, h, d)
        flops = common.attention_flops(b, h, n, n, d, c)
        samples = {name: [] for name in providers}
        for rnd in range(args.repeats):
            for name in common.rotated(providers, rnd):
                progress.step(f"D={d} N={n} causal={int(c)} {name} ({rnd + 1})")
                samples[name].append(common.time_ms(lambda: run(name, inputs, c)))
        point = {}
        for name in providers:
            ms = statistics.median(samples[name])
            err = errors[name, d, c]
            point[name] = dict(provider=name, head_dim=d, seqlen=n, batch=b, heads=h,
                               causal=int(c), ms=ms, tflops=flops / ms * 1e-9, max_err=err,
                               correct=int(err <= ATOL[name]))
        point["nf-fp8"]["vs_bf16"] = point["nf-fp8"]["tflops"] / point["nf-bf16"]["tflops"]
        rows += point.values()
        torch.cuda.empty_cache()
        common.write_csv(path, rows)
    print(common.format_table(rows, ["provider", "head_dim", "seqlen", "causal", "ms", "tflops",
                                     "vs_bf16", "max_err", "correct"]))
    print(f"wrote {path}")
    if not args.no_plot:
        attn = [r for r in rows if r["provider"].startswith("nf-")]
        ceiling = next(r["tflops"] for r in rows if r["provider"] == "matmul-fp8")
        plot = common.plot_panels(out / "fp8.png", attn, "seqlen", "tflops",
                                  ("head_dim", "causal"), "provider", "N", "TFLOP/s",
                                  f"FP8 forward, {common.gpu_name()}",
                                  hline=(ceiling, "e4m3 matmul 8192^3"))
        print(f"wrote {plot}")
    return 0 if all(r.get("correct", 1) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
