"""Demo: ``python -m numba_flash`` runs the forward on random data, checks it against the float64
reference and prints which kernel ran, the error and (on a GPU) the time. Without a GPU it runs
on Numba's CUDA simulator, slowly, on a tiny problem, where a time would mean nothing."""

import argparse
import time

from .runtime.env import use_simulator_without_gpu


def kernel_line(backend, dtype):
    """Which backend and forward kernel ``backend`` picks on this device; for tc under the
    simulator, also which device the simulator plays, since that decides the tc family."""
    from numba_flash import backends
    from numba_flash.runtime import device

    dev = device.current()
    chosen = backends.resolve_backend(backend, dtype, dev)
    line = f"backend {backend} -> {chosen} (kernel {backends.forward_spec(chosen, dev).name})"
    if device.SIMULATOR and chosen == "tc":
        family = backends.tc_family(dev.cc)
        kind = "Hopper wgmma" if family == "wgmma" else "mma.sync"
        line += (f"\n(Numba's CUDA simulator stands in for an sm_{dev.cc[0]}{dev.cc[1]} device, "
                 f"so the tc family is the {kind} one, its instructions emulated)")
    return line


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m numba_flash", description=__doc__)
    p.add_argument("--backend", default="auto", choices=["auto", "simt", "tc"])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--causal", action="store_true")
    args = p.parse_args(argv)

    simulator = use_simulator_without_gpu()
    import numpy as np

    import numba_flash as nf
    from numba_flash import reference
    from numba_flash.runtime import arrays

    B, S, H, D = (1, 24, 2, 32) if simulator else (1, 2048, 16, 64)
    where = "Numba CUDA simulator (no GPU found)" if simulator else "GPU"
    print(f"numba_flash {nf.__version__} on the {where}: B={B} S={S} H={H} D={D} "
          f"{args.dtype} causal={args.causal} backend={args.backend}")
    rng = np.random.default_rng()
    dt = arrays.numpy_dtype(args.dtype)
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32).astype(dt) for _ in range(3))
    if not simulator:
        from numba import cuda

        q, k, v = cuda.to_device(q), cuda.to_device(k), cuda.to_device(v)

    def run():
        out, lse = nf.flash_attn_fwd(q, k, v, causal=args.causal, backend=args.backend)
        if not simulator:
            cuda.synchronize()
        return out, lse

    print(kernel_line(args.backend, args.dtype))
    run()  # compile
    t0 = time.perf_counter()
    out, lse = run()
    ms = (time.perf_counter() - t0) * 1e3
    host = (lambda x: x) if simulator else (lambda x: x.copy_to_host())
    ref_out, ref_lse = reference.attention_fwd_ref(host(q), host(k), host(v), args.causal)
    err = np.abs(host(out).astype(np.float64) - ref_out).max()
    lowp = np.abs(reference.attention_lowp(host(q), host(k), host(v), args.causal) - ref_out).max()
    flops = 4 * B * H * S * S * D * (0.5 if args.causal else 1.0)
    print(f"max |out - ref| = {err:.2e}  (plain {args.dtype} attention: {lowp:.2e})")
    if not simulator:
        print(f"time {ms:.2f} ms, {flops / ms * 1e-9:.1f} TFLOP/s")
    ok = err <= 2 * lowp + 1e-5 if args.dtype != "float32" else err <= 1e-4
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
