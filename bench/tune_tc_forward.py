"""Tile sweep for the tensor-core forward: times tile candidates (BLOCK_M x BLOCK_N x warps x
register cap) of one kernel family (``mma`` or ``wgmma``, default: the device's) on one problem
per head dim and prints TFLOP/s, so the tile tables (``TILES`` of kernels/tc/forward_mma.py and
forward_wgmma.py) are set by measurement. Each candidate's
output is compared with torch SDPA's first (err_vs_sdpa).

    python bench/tune_tc_forward.py --head-dims 64,128 --seqlens 1024,4096
    python bench/tune_tc_forward.py --head-dims 128 --family mma --candidates 128x32x4x0
"""

import argparse
import itertools
import sys

import common

# Per head dim: 16 rows per warp in 8-warp blocks (capped at 128 registers: 16 warps per SM, or
# uncapped with wider key tiles), and 32 rows per warp in 4-warp blocks (each K/V fragment feeds
# two mma) with up to 255 registers. All spill-free on sm_80 and sm_90.
# wgmma: 64 query rows per warpgroup (warps = BLOCK_M / 16), one or more warpgroups per block.
CANDIDATES = {
    "mma": {
        64: "128x64x8x128,128x128x8x0,128x64x4x0,128x96x4x0",
        128: "128x32x8x128,128x64x8x0,128x128x8x0,128x32x4x0,128x48x4x0,128x64x4x0",
        256: "64x32x4x0,64x16x4x0",
    },
    "wgmma": {
        64: "128x128x8x0,192x128x12x0,64x128x4x0,128x64x8x0,64x64x4x0",
        128: "128x128x8x0,128x64x8x0,192x64x12x0,64x128x4x0,64x64x4x0",
        256: "64x64x4x0,64x32x4x0",
    },
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlens", default="4096", help="comma-separated N (B = 32k / N)")
    p.add_argument("--candidates", default=None, help="BMxBNxWARPSxREGS,... (default: per head dim)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--family", choices=("mma", "wgmma"), default=None,
                   help="tc kernel family (default: the device's, backends.tc_family)")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)

    import torch

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numba_flash import backends
    from numba_flash.kernels.tc import forward_mma, forward_wgmma
    from numba_flash.runtime import arrays, device, launcher, status

    out = common.results_dir(args.out_dir)
    dev = device.current()
    family = args.family or backends.tc_family(dev.cc)
    spec = {"mma": forward_mma.SPEC, "wgmma": forward_wgmma.SPEC}[family]
    rows = []
    for d, causal in itertools.product([int(x) for x in args.head_dims.split(",")], (False, True)):
        config = spec.Config(d, causal, args.dtype)
        kernels = []
        for cand in (args.candidates or CANDIDATES[family][d]).split(","):
            with spec.forcing(tuple(int(x) for x in cand.split("x"))):
                kernel, t = spec.compiled(config, dev)
            kernels.append((cand, t, kernel))
        for n in (int(x) for x in args.seqlens.split(",")):
            b, h = max(32768 // n, 1), 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=getattr(torch, args.dtype))
                       for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
            ).transpose(1, 2)
            tq, tk, tv = (arrays.adapt(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
            o = arrays.empty(tq, tq.shape, tq.fmt, "out")
            lse = arrays.empty(tq, (b, h, n), "float32", "lse")
            stream = arrays.stream_of(tq)
            flops = common.attention_flops(b, h, n, n, d, causal)
            # Every candidate is compiled and checked before any is timed: a JIT compile is
            # seconds of CPU time on an idle GPU, whose clock would still be low for the next
            # timing.
            checked = []
            problem = dict(q=tq, k=tk, v=tv, out=o, lse=lse, scale=d ** -0.5,
                           status=status.word(tq))
            for cand, t, kernel in kernels:
                def run(kernel=kernel, t=t, grid=spec.grid(config, t, problem),
                        arguments=spec.arguments(config, problem)):
                    launcher.launch(kernel, grid, t.threads, stream, t.shared_bytes, *arguments)
                run()
                err = (o.obj.float() - ref.float()).abs().max().item()
                checked.append((cand, t, kernel.library.get_cufunc().attrs, run, err))

            def sdpa():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
            checked.append(("", None, None, sdpa, 0.0))
            for cand, t, attrs, run, err in checked:
                ms = common.time_ms(run)
                rows.append(dict(family=family if t else "sdpa-flash", head_dim=d, seqlen=n,
                                 causal=int(causal), tiles=cand, regs=attrs.regs if t else 0,
                                 local_bytes=attrs.local if t else 0,
                                 smem_kb=t.shared_bytes / 1024 if t else 0, err_vs_sdpa=err,
                                 ms=ms, tflops=flops / ms * 1e-9))
                print(common.format_table(rows[-1:], list(rows[-1])), flush=True)
                common.write_csv(out / "tune_tc_forward.csv", rows)  # kept if cut short
    print(common.format_table(rows, list(rows[0])))


if __name__ == "__main__":
    sys.exit(main())
