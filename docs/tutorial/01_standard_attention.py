"""Chapter 1: the standard attention in three kernels, and the bytes it moves.

Runs the three-kernel baseline (numba_flash/kernels/naive.py) against the float64 reference, then
reads the committed Nsight Compute measurements (bench/results/NVIDIA-H200/io_bytes.csv) and
turns them into FLOPs per byte, against the machine balance the project's own benchmarks measured.
"""

import numpy as np

import _tutorial


def traffic_model(n, d, itemsize=2):
    """Bytes the three kernels move for one (batch, head) by the chapter's count: Q, K, V, O once
    each (the N d term), and the float32 N x N matrix four times (S written and read, P written
    and read: the N^2 term)."""
    return 4 * n * d * itemsize, 4 * 4 * n * n


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    from numba_flash import api, reference

    # 1. The baseline is exact attention: check it.
    B, S, H, D = (1, 16, 1, 16) if args.simulator else (2, 2048, 8, 64)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float16) for _ in range(3))
    out, lse = api.naive_attention(*(_tutorial.device_array(x, args.simulator) for x in (q, k, v)))
    out = _tutorial.host(out)
    ref, ref_lse = reference.attention_fwd_ref(q, k, v)
    err = float(np.abs(out.astype(np.float64) - ref).max())
    print(f"naive attention, B={B} S={S} H={H} D={D} float16: max |out - ref| = {err:.2e}")

    # 2. What it moves: the model, and what Nsight Compute measured on the H200.
    rows = _tutorial.read_csv("io_bytes.csv")
    d = int(rows[0]["head_dim"])
    heads = int(rows[0]["batch"]) * int(rows[0]["heads"])
    measured = {}
    for r in rows:
        hbm = float(r["dram__bytes_read.sum"]) + float(r["dram__bytes_write.sum"])
        measured[r["kernel"], int(r["seqlen"])] = (hbm, float(r["lts__t_bytes.sum"]))
    ns = sorted({n for _, n in measured})
    print(f"\nio_bytes.csv, d = {d}, {heads} (batch, head) pairs; bytes per forward")
    print(f"{'N':>6} {'model Nd':>10} {'model N^2':>10} {'naive HBM':>10} {'naive L2':>10} "
          f"{'flash HBM':>10} {'flash L2':>10}")
    for n in ns:
        nd, nn = (heads * x for x in traffic_model(n, d))
        print(f"{n:>6} {nd:>10.3g} {nn:>10.3g} {measured['naive', n][0]:>10.3g} "
              f"{measured['naive', n][1]:>10.3g} {measured['flash', n][0]:>10.3g} "
              f"{measured['flash', n][1]:>10.3g}")

    # 3. FLOPs per byte against the balance of the machine: the best forward the project measured
    #    on the H200 over the bandwidth of a device-to-device copy in the decode benchmark.
    tflops = max(float(r["tflops"]) for r in _tutorial.read_csv("attention_fwd.csv"))
    copy_tbps = float(_tutorial.read_csv("mla_decode.csv")[0]["copy_tbps"])
    balance = tflops / copy_tbps
    print(f"\nmachine balance: {tflops:.0f} TFLOP/s (attention_fwd.csv, best row) / "
          f"{copy_tbps:.2f} TB/s (mla_decode.csv, copy_tbps) = {balance:.0f} FLOP per HBM byte")
    intensity = {}
    for kernel in ("naive", "flash"):
        intensity[kernel] = [4 * n * n * d * heads / measured[kernel, n][0] for n in ns]
        print(f"{kernel:>5}: FLOP per HBM byte " +
              " ".join(f"{x:.3g}" for x in intensity[kernel]) + f"  (N = {ns[0]} .. {ns[-1]})")

    plt = _tutorial.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for kernel, color in (("naive", "tab:red"), ("flash", "tab:blue")):
        ax.plot(ns, intensity[kernel], "o-", color=color, label=f"{kernel} forward (measured)")
    ax.axhline(balance, color="gray", ls="--", label=f"machine balance ~{balance:.0f}")
    ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="FLOP per HBM byte",
           title=f"arithmetic intensity, d = {d} (io_bytes.csv)")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _tutorial.save(fig, args, "01_intensity.png")
    return dict(q=q, k=k, v=v, out=out, lse=_tutorial.host(lse), ref=ref, ref_lse=ref_lse,
                intensity=intensity, balance=balance, ns=ns, measured=measured)


if __name__ == "__main__":
    main()
