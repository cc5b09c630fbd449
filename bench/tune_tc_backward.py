"""Tile sweep for the tensor-core backward: times each kernel (dK/dV, dQ) of
kernels/tc/backward_mma.py (tile candidates BLOCK_M x BLOCK_N x warps) or, with ``--family
wgmma``, of kernels/tc/backward_wgmma.py (BLOCK_M x BLOCK_N) on one problem per head dim and
causal mode, so the ``TILES`` tables there are set by measurement. The gradients of every
candidate are compared with torch autograd through SDPA first (err_vs_sdpa, max over dq, dk,
dv).

    python bench/tune_tc_backward.py --head-dims 64,128 --seqlens 4096
    python bench/tune_tc_backward.py --head-dims 128 --dkdv 64x64x4,32x128x8 --dq 64x64x4
    python bench/tune_tc_backward.py --family wgmma      # tune_tc_backward_wgmma.csv
"""

import argparse
import itertools
import sys

import common

CANDIDATES = {
    "mma": {  # dK/dV: BLOCK_N = 16 warps / (warps sharing 16 keys); dQ: BLOCK_M = 16 warps
        "dkdv": {64: "64x64x4,32x64x4,128x64x4,64x128x8,32x128x8",
                 128: "32x64x4,64x64x4,16x64x4,32x128x8,64x128x8",
                 256: "32x32x4,16x32x4"},
        "dq": {64: "64x64x4,64x32x4,64x128x4,128x64x8,128x32x8",
               128: "64x64x4,64x32x4,128x64x8,128x32x8",
               256: "64x32x4,64x16x4"},
    },
    "wgmma": {  # dK/dV: BLOCK_N = 64 keys per warpgroup; dQ: BLOCK_M = 64 queries per warpgroup
        "dkdv": {64: "64x128,128x128,64x64,128x64,64x192",
                 128: "64x128,32x128,64x64,128x64"},
        "dq": {64: "128x64,128x128,64x128,192x64",
               128: "128x64,128x32,64x64,64x128"},
    },
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlens", default="4096", help="comma-separated N (B = 32k / N)")
    p.add_argument("--family", choices=("mma", "wgmma"), default="mma")
    p.add_argument("--dkdv", default=None, help="BMxBN[xWARPS],... (default: per head dim)")
    p.add_argument("--dq", default=None, help="BMxBN[xWARPS],... (default: per head dim)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)

    import torch

    import numba_flash as nf
    from numba_flash.kernels.simt import backward as simt_backward
    from numba_flash.kernels.tc import backward_mma, backward_wgmma
    from numba_flash.runtime import arrays, device, launcher, status

    out = common.results_dir(args.out_dir)
    dev = device.current()
    rows = []
    module = backward_wgmma if args.family == "wgmma" else backward_mma
    specs = (("dkdv", module.DKDV), ("dq", module.DQ))
    csv = "tune_tc_backward_wgmma.csv" if args.family == "wgmma" else "tune_tc_backward.csv"
    for d, causal in itertools.product([int(x) for x in args.head_dims.split(",")], (False, True)):
        config = backward_mma.DKDV.Config(d, causal, args.dtype)
        compiled = []
        for name, spec in specs:
            for cand in (getattr(args, name) or CANDIDATES[args.family][name][d]).split(","):
                with spec.forcing(tuple(int(x) for x in cand.split("x"))):
                    kernel, t = spec.compiled(config, dev)
                compiled.append((name, cand, spec, kernel, t))
        for n in (int(x) for x in args.seqlens.split(",")):
            b, h = max(32768 // n, 1), 2048 // d
            dt = getattr(torch, args.dtype)
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dt) for _ in range(4))
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            ref = torch.nn.functional.scaled_dot_product_attention(
                *(x.transpose(1, 2) for x in leaves), is_causal=causal).transpose(1, 2)
            ref.backward(do)
            o, lse = nf.flash_attn_fwd(q, k, v, causal=causal)
            t = {x: arrays.adapt(y, x) for x, y in (("q", q), ("k", k), ("v", v), ("dout", do),
                                                    ("out", o), ("lse", lse))}
            grads = {x: torch.empty_like(y) for x, y in (("dq", q), ("dk", k), ("dv", v))}
            problem = dict(t, **{x: arrays.adapt(y, x) for x, y in grads.items()}, scale=d ** -0.5,
                           delta=arrays.adapt(torch.empty(b, h, n, device="cuda"), "delta"),
                           status=status.word(t["q"]))
            stream = arrays.stream_of(problem["q"])
            simt_backward.PREPROCESS.launch(config._replace(causal=False), problem, stream, dev)
            flops = common.attention_flops(b, h, n, n, d, causal, mode="bwd")
            checked = []
            for name, cand, spec, kernel, tiles in compiled:
                def run(kernel=kernel, tiles=tiles, spec=spec):
                    launcher.launch(kernel, spec.grid(config, tiles, problem), tiles.threads,
                                    stream, tiles.shared_bytes, *spec.arguments(config, problem))
                run()
                which = ("dk", "dv") if name == "dkdv" else ("dq",)
                err = max((grads[w].float() - leaves["dq dk dv".split().index(w)].grad.float())
                          .abs().max().item() for w in which)
                checked.append((name, cand, tiles, kernel.library.get_cufunc().attrs, run, err))
            for name, cand, tiles, attrs, run, err in checked:
                ms = common.time_ms(run)
                rows.append(dict(kernel=name, head_dim=d, seqlen=n, causal=int(causal),
                                 tiles=cand, regs=attrs.regs, local_bytes=attrs.local,
                                 smem_kb=tiles.shared_bytes / 1024, err_vs_sdpa=err, ms=ms,
                                 tflops=flops / ms * 1e-9))
                print(common.format_table(rows[-1:], list(rows[-1])), flush=True)
                common.write_csv(out / csv, rows)  # kept if cut short
    print(common.format_table(rows, list(rows[0])))


if __name__ == "__main__":
    sys.exit(main())
