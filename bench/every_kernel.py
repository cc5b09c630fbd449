"""Every kernel of every family once, on small odd shapes, checked against the float64 reference:
the workload that `bench/gpu_run.sh sanitize` runs under compute-sanitizer (memcheck, racecheck,
synccheck, initcheck), so that one process touches every launch path.

    python bench/every_kernel.py                # exit status 0 when every result is right
    python bench/every_kernel.py --quick        # float16, causal and the s_q = 2 decode only
    python bench/every_kernel.py --family mma   # only the tc calls, planned as for an A100
    python bench/every_kernel.py --no-seesaw    # without the seesaw decode (for racecheck)

Covers the naive baseline, the simt forwards (the tiled one and the one-thread-per-row teaching
kernel), the tc forward (on a Hopper the wgmma kernel, elsewhere mma.sync; ``--family mma`` runs
only the tc calls, planned for an sm_80 part, so a Hopper runs the mma.sync kernels) and both
backwards, the MLA planner on the device, both MLA decodes with split pieces and the combine
(both ways of copying the cache on a Hopper, and there the seesaw kernel too). Shapes are off
every tile multiple: Sq 37, Sk 53, GQA 4:2, head dim 40, paged caches of 5- and 64-row pages.
Without a GPU it turns Numba's CUDA simulator on (as ``python -m numba_flash`` does) and the same
calls run on emulated instructions, on smaller shapes; the tests run it there. On a GPU it needs
CuPy (the ``cupy12`` / ``cupy13`` extra).
"""

import argparse
import sys

import numpy as np

from numba_flash.runtime.env import use_simulator_without_gpu


def _device(x):
    from numba_flash.runtime.device import SIMULATOR

    if SIMULATOR:
        return x
    import cupy

    return cupy.asarray(x)


def _host(x):
    if isinstance(x, np.ndarray):
        return x
    import cupy

    return cupy.asnumpy(x)


def _error(got, want):
    return float(np.max(np.abs(_host(got).astype(np.float64) - want)))


def parse(argv):
    p = argparse.ArgumentParser(prog="python bench/every_kernel.py",
                                description=__doc__.split("\n\n")[0],
                                epilog="Exit status 0 when every result agrees with the reference.")
    p.add_argument("--quick", action="store_true",
                   help="float16, causal and the s_q = 2 decode only")
    p.add_argument("--family", choices=("default", "mma"), default="default",
                   help="mma: only the tc calls, planned as for an A100 (sm_80)")
    p.add_argument("--no-seesaw", dest="seesaw", action="store_false",
                   help="leave out the seesaw decode, which racecheck misreads "
                        "(tools/racecheck_arrive.py)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    quick, mma, seesaw = args.quick, args.family == "mma", args.seesaw
    if not use_simulator_without_gpu():  # decided before Numba loads, which reads it once
        try:
            import cupy  # noqa: F401
        except ImportError:
            sys.exit("every_kernel.py: a GPU is present but CuPy is not installed; install the "
                     "cupy12 or cupy13 extra (python -m pip install \".[cu13,cupy13]\")")
    from contextlib import nullcontext

    import ml_dtypes

    import numba_flash as nf
    from numba_flash import reference
    from numba_flash import api
    from numba_flash.kernels.simt import forward_rowwise
    from numba_flash.runtime import device
    from numba_flash.runtime.device import SIMULATOR

    def planned(backend):
        """The tc calls under ``--family mma``: planned for an A100's blocks."""
        if backend != "tc" or not mma:
            return nullcontext()
        return device.plan_for(device.Device(cc=(8, 0), sms=device.current().sms,
                                             shared_per_block=166912))

    backends = ("tc",) if mma else ("simt", "tc")  # the simt calls do not depend on the family
    rng = np.random.default_rng(7)
    bf16 = ml_dtypes.bfloat16
    failures = []

    def check(name, got, want, atol):
        err = _error(got, want)
        print(f"{name:36s} max error {err:.2e}", flush=True)
        if not err <= atol:
            failures.append(name)

    # Attention: B 2, Sq 37, Sk 53, Hq 4, Hk 2, D 40 (the simulator: one batch, 13 x 21, 2:1, 16).
    B, Sq, Sk, Hq, Hk, D = (1, 13, 21, 2, 1, 16) if SIMULATOR else (2, 37, 53, 4, 2, 40)
    for fmt, dtype in (("float16", np.float16),) + ((("bfloat16", bf16),) if not quick else ()):
        q, k, v, dout = (rng.standard_normal(s).astype(np.float32).astype(dtype)
                         for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D), (B, Sq, Hq, D)))
        for causal in (True,) if quick else (False, True):
            want, _ = reference.attention_fwd_ref(q, k, v, causal)
            for backend in backends:
                tag = f"{backend} {fmt} causal={causal}"
                with planned(backend):
                    out, lse = nf.flash_attn_fwd(_device(q), _device(k), _device(v),
                                                 causal=causal, backend=backend)
                    check(f"forward {tag}", out, want, 2e-2)
                    grads = nf.flash_attn_bwd(_device(dout), _device(q), _device(k),
                                              _device(v), out, lse, causal=causal,
                                              backend=backend)
                ref = reference.attention_bwd_ref(dout, q, k, v, causal)
                for name, got, w in zip(("dq", "dk", "dv"), grads, ref):
                    check(f"backward {name} {tag}", got, w, 8e-2)
        if fmt == "float16" and not mma:
            check("naive float16", api.naive_attention(_device(q), _device(k), _device(v))[0],
                  reference.attention_fwd_ref(q, k, v, False)[0], 2e-2)
            check("forward rowwise float16",
                  forward_rowwise.run(_device(q), _device(k), _device(v), causal=True)[0],
                  reference.attention_fwd_ref(q, k, v, True)[0], 2e-2)

    # Paged MLA decode: lengths off the page and tile grid, a split request; 5-row pages (row
    # copies) and 64-row pages (whole tiles: TMA boxes on a Hopper). On a GPU also head dims
    # 192 / 64, DeepSeek's 576 / 512 scaled down (a rope block past the V columns), which a
    # Hopper's tc family runs on the seesaw kernel (under the simulator its own tests run it).
    seqlens = np.array([140, 1, 0, 77] if SIMULATOR else [300, 1, 0, 77], np.int32)
    shapes = [(48, 32, page) for page in (5, 64)] + ([(192, 64, 64)] if seesaw and not SIMULATOR
                                                     else [])
    for d, dv, page in shapes:
        pages = [max(-(-int(n) // page), 1) for n in seqlens]
        k_cache = rng.standard_normal((sum(pages), page, 1, d)).astype(np.float32).astype(bf16)
        table = np.zeros((len(seqlens), max(pages)), np.int32)
        order = iter(rng.permutation(sum(pages)))
        for i, n in enumerate(pages):
            table[i, :n] = [next(order) for _ in range(n)]
        for s_q, h_q in ((2, 8),) if quick else ((1, 1), (2, 8)):
            q = rng.standard_normal((len(seqlens), s_q, h_q, d)).astype(np.float32).astype(bf16)
            meta = nf.get_mla_metadata(_device(seqlens), s_q * h_q, 1, num_sms=6)
            want, _ = reference.mla_decode_ref(q, k_cache, table, seqlens, dv, causal=s_q > 1)
            for backend in backends:
                name = f"decode {backend} d={d} page={page} s_q={s_q} h_q={h_q}"
                try:
                    with planned(backend):
                        out, _ = nf.flash_mla_with_kvcache(_device(q), _device(k_cache),
                                                           _device(table), _device(seqlens), dv,
                                                           *meta, causal=s_q > 1,
                                                           backend=backend)
                except ValueError as exc:  # a device without the tc decode says so
                    print(f"{name}: not run ({exc})")
                    continue
                check(name, out, want, 3e-2)
    nf.check_errors()
    if failures:
        print("wrong results:", ", ".join(failures))
        return 1
    print("every kernel ran and agreed with the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
