"""Chapter 3: a minimal flash forward, one thread per query row.

Runs numba_flash/kernels/simt/forward_rowwise.py through its spec against the float64 reference,
prints its launch geometry and shared-memory budget (from the kernel's own ``shared_layout``), and
what the committed benchmark CSVs say about its speed and the SIMT forward's.
"""

import glob
import os

import numpy as np

import _tutorial


def measured(provider):
    """(file, rows) of every committed attention CSV with rows of ``provider``."""
    found = []
    for path in sorted(glob.glob(str(_tutorial.RESULTS / "attention_*.csv"))):
        rows = [r for r in _tutorial.read_csv(os.path.basename(path)) if r["provider"] == provider]
        if rows:
            found.append((os.path.basename(path), rows))
    return found


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    from numba_flash import reference
    from numba_flash.kernels.simt import forward, forward_rowwise as rw
    from numba_flash.runtime import device

    # 1. The kernel against the reference: GQA, causal, Sk spanning two key tiles.
    B, Sq, Sk, Hq, Hk, D = (1, 20, 45, 2, 1, 16) if args.simulator else (2, 2048, 2048, 8, 2, 64)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, Sk, Hk, D)).astype(np.float16) for _ in range(2))
    dq, dk, dv = (_tutorial.device_array(x, args.simulator) for x in (q, k, v))
    out, lse = rw.run(dq, dk, dv, causal=True)
    out, lse = _tutorial.host(out), _tutorial.host(lse)
    ref, ref_lse = reference.attention_fwd_ref(q, k, v, True)
    err = float(np.abs(out.astype(np.float64) - ref).max())
    config = rw.SPEC.Config(D, True, "float16")
    tiles = rw.SPEC.choose(config, device.current())
    print(f"flash_fwd_rowwise, B={B} Sq={Sq} Sk={Sk} Hq={Hq} Hk={Hk} D={D} causal float16")
    print(f"  grid ({-(-Sq // tiles.BLOCK_M)}, {B * Hq}), {tiles.threads} threads (one per query "
          f"row), BLOCK_N = {tiles.BLOCK_N}, {tiles.shared_bytes} bytes of shared memory")
    print(f"  max |out - ref| = {err:.2e}, max |lse - ref| = "
          f"{np.abs(lse - ref_lse)[np.isfinite(ref_lse)].max():.2e}")
    if not args.simulator:
        import time

        from numba import cuda

        rw.run(dq, dk, dv, causal=True)
        cuda.synchronize()
        t = time.perf_counter()
        rw.run(dq, dk, dv, causal=True)
        cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t)
        flops = 2 * 2 * B * Hq * Sq * Sk * D  # two products; about half of them are masked away
        print(f"  this GPU, one timed call: {ms:.3f} ms "
              f"({flops / 2 / ms / 1e9:.2f} TFLOP/s causal)")

    # 2. Shared memory per block, from the kernel's layout, beside the SIMT forward's.
    head_dims = (8, 16, 32, 64, 96, 128)
    budget = {}
    print(f"\n{'D':>4} {'BLOCK_N':>8} {'Q':>7} {'K':>7} {'V':>7} {'S':>7} {'total':>8}  "
          "simt forward")
    for d in head_dims:
        t = rw.SPEC.choose(rw.SPEC.Config(d, False, "float16"), None)
        lay = rw.shared_layout(t.BLOCK_N, d)
        parts = [lay.unit * lay.sizes[name] for name in ("q", "k", "v", "s")]
        budget[d] = parts
        simt = forward.SPEC.choose(forward.SPEC.Config(d, False, "float16"), None).shared_bytes
        print(f"{d:>4} {t.BLOCK_N:>8} " + " ".join(f"{x:>7}" for x in parts) +
              f" {t.shared_bytes:>8}  {simt:>11}")
        assert sum(parts) == t.shared_bytes

    # 3. Speed: only what the committed CSVs hold.
    print()
    for provider in ("nf-rowwise", "naive", "nf-simt"):
        found = measured(provider)
        if not found:
            print(f"{provider}: no committed measurement "
                  "(no row in bench/results/NVIDIA-H200/attention_*.csv)")
        for name, rows in found:
            tf = [float(r["tflops"]) for r in rows]
            print(f"{provider}: {min(tf):.1f}-{max(tf):.1f} TFLOP/s over {len(rows)} points "
                  f"({name})")

    plt = _tutorial.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    bottom = np.zeros(len(head_dims))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:gray")
    for i, (name, color) in enumerate(zip("QKVS", colors)):
        heights = np.array([budget[d][i] for d in head_dims]) / 1024
        ax.bar([str(d) for d in head_dims], heights, bottom=bottom, color=color, label=name)
        bottom += heights
    ax.axhline(48, color="black", ls="--", lw=1, label="48 KiB without opt-in")
    ax.set(xlabel="head dim D", ylabel="KiB per block", title="flash_fwd_rowwise: shared memory")
    ax.legend(fontsize=8)
    _tutorial.save(fig, args, "03_shared_memory.png")
    return dict(q=q, k=k, v=v, out=out, lse=lse, ref=ref, ref_lse=ref_lse, budget=budget,
                rowwise_measured=measured("nf-rowwise"))


if __name__ == "__main__":
    main()
