"""Chapter 5: the backward, numba_flash/kernels/simt/backward.py.

Shows in NumPy that P comes back exactly from Q, K and the saved lse, and that D_i = rowsum(dO_i *
O_i) is the softmax backward's row term; runs the three backward kernels against the float64
reference; and runs them again to show the gradients are bitwise the same, where summing the same
partials in another order (what atomics do) is not.
"""

import numpy as np

import _tutorial


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    import numba_flash as nf
    from numba_flash import reference

    B, S, Hq, Hk, D = (1, 24, 2, 1, 16) if args.simulator else (2, 1024, 8, 2, 64)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, S, Hk, D)).astype(np.float16) for _ in range(2))
    dout = rng.standard_normal((B, S, Hq, D)).astype(np.float16)
    dev = [_tutorial.device_array(x, args.simulator) for x in (dout, q, k, v)]
    out, lse = nf.flash_attn_fwd(*dev[1:], causal=True, backend="simt")
    o, lse_h = _tutorial.host(out).astype(np.float64), _tutorial.host(lse).astype(np.float64)

    # 1. Recomputation: P_ij = exp(S_ij - lse_i) is the softmax itself, no second pass needed.
    scale = D ** -0.5
    k64, v64 = (np.repeat(x.astype(np.float64), Hq // Hk, axis=2) for x in (k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k64) * scale
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - lse_h[..., None])
    ref_p = np.exp(s - s.max(-1, keepdims=True))
    ref_p /= ref_p.sum(-1, keepdims=True)
    p_err = float(np.abs(p - ref_p).max())
    print(f"B={B} S={S} Hq={Hq} Hk={Hk} D={D} causal float16")
    print(f"P recomputed from the kernel's lse: max |P - softmax(S)| = {p_err:.2e}")

    # 2. D_i = rowsum(dO_i * O_i) equals rowsum(P_ij * dP_ij), the term of dS = P * (dP - D_i).
    do = dout.astype(np.float64)
    dp = np.einsum("bqhd,bkhd->bhqk", do, v64)
    d_from_o = np.einsum("bqhd,bqhd->bhq", do, o)
    d_from_p = (p * dp).sum(-1)
    d_err = float(np.abs(d_from_o - d_from_p).max())
    print(f"D_i from O (N d work) vs from P and dP (N^2 d work): max difference {d_err:.2e} "
          f"(O was stored in float16)")

    # 3. The kernels against the reference, then again: bit for bit.
    runs = [nf.flash_attn_bwd(*dev, out, lse, causal=True, backend="simt") for _ in range(2)]
    grads = [tuple(_tutorial.host(g) for g in run) for run in runs]
    ref = reference.attention_bwd_ref(dout, q, k, v, True)
    lowp = reference.attention_bwd_lowp(dout, q, k, v, True)
    for name, g, r in zip(("dq", "dk", "dv"), grads[0], ref):
        print(f"{name}: max |kernel - ref| = {np.abs(g.astype(np.float64) - r).max():.2e}")
    same = all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(*grads))
    print(f"two backward runs bitwise identical: {same}")

    # 4. What atomics would do: dK_j sums one partial per query tile, in arrival order.
    tile = 3 if args.simulator else 64
    ds = p * (dp - d_from_o[..., None])
    parts = np.stack([np.einsum("bhqk,bqhd->bkhd", ds[:, :, i:i + tile], q[:, i:i + tile].astype(
        np.float64)).astype(np.float32) for i in range(0, S, tile)])
    fixed = parts.sum(axis=0, dtype=np.float32)
    shuffled = parts[::-1].sum(axis=0, dtype=np.float32)  # the same partials, last tile first
    differ = int((fixed.view(np.uint32) != shuffled.view(np.uint32)).sum())
    print(f"dK from {len(parts)} float32 partials: the reverse order changes {differ} of "
          f"{fixed.size} elements in their last bits")

    plt = _tutorial.pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4))
    im = ax.imshow(p[0, 0], cmap="viridis")
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax.set(xlabel="key j", ylabel="query i", title="P = exp(S - lse), recomputed (head 0)")
    _tutorial.save(fig, args, "05_recomputed_p.png")
    return dict(p_err=p_err, d_err=d_err, grads=grads[0], ref=ref, lowp=lowp, same=same,
                differ=differ)


if __name__ == "__main__":
    main()
