"""Tile sweep for the tensor-core forward: times every (BLOCK_M, BLOCK_N, register cap) candidate
on one problem per head dim and prints TFLOP/s, so launch.py's table can be set by measurement.

    python bench/tune_tc_forward.py --head-dims 64,128 --seqlen 4096
"""

import argparse
import itertools
import math
import sys

import common


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--block-m", default="64,128")
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--max-registers", default="0,128", help="0: no cap")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)

    import torch
    from numba import cuda

    import numba_flash as nf
    from numba_flash import arrays, launch
    from numba_flash.kernels.tc import forward

    rows = []
    for d, causal in itertools.product([int(x) for x in args.head_dims.split(",")], (False, True)):
        n = args.seqlen
        b, h = max(32768 // n, 1), 2048 // d
        dt = getattr(torch, args.dtype)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dt) for _ in range(3))
        ref, _ = nf.flash_attn_fwd(q, k, v, causal=causal, backend="tc")
        tq, tk, tv = (arrays.adapt(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
        o, lse = arrays.empty(tq, tq.shape, tq.fmt, "out"), arrays.empty(tq, (b, h, n), "float32", "lse")
        stream = arrays.stream_of(tq)
        flops = common.attention_flops(b, h, n, n, d, causal)
        for bm, bn, maxreg in itertools.product(*(map(int, x.split(",")) for x in
                                                  (args.block_m, args.block_n, args.max_registers))):
            pyfunc = forward.make_forward_kernel(d, bm, bn, causal, tq.fmt)
            shared = 2 * forward.shared_elements(bm, bn, d)
            opts = dict(launch.COMPILE_OPTIONS, **({"max_registers": maxreg} if maxreg else {}))
            kernel = cuda.jit(launch.attention_signature(tq.fmt), **opts)(pyfunc)
            if shared > launch.DEFAULT_SHARED_LIMIT:
                launch._opt_in_shared(kernel, shared)
            regs = next(iter(kernel.overloads.values()))._codelibrary.get_cufunc().attrs.regs

            def run():
                launch.launch(kernel, (launch.cdiv(n, bm), b * h), 32 * (bm // 16), stream, shared,
                              tq.view, tk.view, tv.view, o.view, lse.view, n, n, h, 1,
                              float(d ** -0.5 * math.log2(math.e)))
            run()
            err = (o.obj.float() - ref.float()).abs().max().item()
            ms = common.time_ms(run)
            rows.append(dict(head_dim=d, causal=int(causal), block_m=bm, block_n=bn, maxreg=maxreg,
                             regs=regs, smem_kb=shared / 1024, err=err, ms=ms,
                             tflops=flops / ms * 1e-9))
            print(common.format_table(rows[-1:], list(rows[-1])), flush=True)
    out = common.results_dir(args.out_dir)
    common.write_csv(out / "tune_tc_forward.csv", rows)
    print(common.format_table(rows, list(rows[0])))


if __name__ == "__main__":
    sys.exit(main())
