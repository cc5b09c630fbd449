"""Chapter 2: the online softmax, one row in NumPy, then the kernel that runs it in parallel.

The recurrence keeps, after each block of scores, the running maximum m, the running sum l of
exp(x - m) and the running weighted sum o of exp(x - m) v. The script checks the invariant after
every block, then runs the softmax kernel of numba_flash/kernels/naive.py, whose 128 threads each
run the recurrence over their own columns and then merge their (m, l) pairs.
"""

import numpy as np

import _tutorial


def online_softmax(x, v, block):
    """The recurrence over ``x`` (one row of scores) and ``v`` (a value per score), ``block``
    scores at a time. Returns the state after each block: [(end, m, l, o, alpha)]."""
    m, l, o = -np.inf, 0.0, 0.0
    states = []
    for start in range(0, len(x), block):
        xb, vb = x[start:start + block], v[start:start + block]
        m_new = max(m, xb.max())
        alpha = np.exp(m - m_new)  # the old terms were scaled by exp(-m); now by exp(-m_new)
        p = np.exp(xb - m_new)
        l = l * alpha + p.sum()
        o = o * alpha + p @ vb
        m = m_new
        states.append((start + len(xb), m, l, o, alpha))
    return states


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    rng = np.random.default_rng(2)

    # 1. One row in NumPy. Scores in the hundreds: exp(x) alone overflows float32 past 88.
    n, block = 64, 8
    x = rng.standard_normal(n) * 3 + 300 + np.linspace(0, 20, n)
    v = rng.standard_normal(n)
    states = online_softmax(x, v, block)
    with np.errstate(over="ignore"):
        print(f"one row of {n} scores (max {x.max():.1f}; float32 exp of it: "
              f"{np.exp(np.float32(x.max()))}), blocks of {block}")
    print(f"{'keys':>5} {'m':>9} {'l':>9} {'alpha':>9} {'|l - sum exp(x - m)|':>22} "
          f"{'|o / l - softmax . v|':>22}")
    worst = 0.0
    for end, m, l, o, alpha in states:
        # The invariant: the state is exactly that of the first `end` scores, computed at once.
        l_exact = np.exp(x[:end] - x[:end].max()).sum()
        w = np.exp(x[:end] - x[:end].max())
        o_exact = (w / w.sum()) @ v[:end]
        e_l, e_o = abs(l - l_exact) / l_exact, abs(o / l - o_exact)
        worst = max(worst, e_l, e_o)
        print(f"{end:>5} {m:>9.3f} {l:>9.4f} {alpha:>9.3g} {e_l:>22.2e} {e_o:>22.2e}")
    print(f"worst deviation from the invariant: {worst:.2e}")

    # 2. The same recurrence in a kernel: naive.py's softmax kernel, one block of 128 threads
    #    per row; thread t runs it over columns t, t + 128, ... and a tree merges the pairs.
    from numba_flash.kernels import naive
    from numba_flash.runtime import arrays, device

    rows, cols = (3, 300) if args.simulator else (64, 8192)
    s = (rng.standard_normal((1, 1, rows, cols)) * 4).astype(np.float32)
    scores = arrays.adapt(_tutorial.device_array(s.copy(), args.simulator), "scores")
    lse = arrays.empty(scores, (1, 1, rows), "float32", "lse")
    # The kernel reads only the shapes of q and k (Sq, Sk, the heads): one-column stand-ins.
    shape_of = {name: arrays.adapt(_tutorial.device_array(np.zeros((1, n_, 1, 1), np.float32),
                                                          args.simulator), name)
                for name, n_ in (("q", rows), ("k", cols))}
    naive.SOFTMAX.launch(naive.Config(False, "float32"), dict(scores=scores, lse=lse, **shape_of),
                         arrays.stream_of(scores), device.current())
    p = _tutorial.host(scores.obj)[0, 0]
    got_lse = _tutorial.host(lse.obj)[0, 0]
    x64 = s[0, 0].astype(np.float64)
    ref_lse = x64.max(1) + np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1))
    ref_p = np.exp(x64 - ref_lse[:, None])
    kernel_err = float(np.abs(p - ref_p).max())
    lse_err = float(np.abs(got_lse - ref_lse).max())
    print(f"\nnaive_softmax kernel, {rows} rows of {cols}: max |P - P_ref| = {kernel_err:.2e}, "
          f"max |lse - lse_ref| = {lse_err:.2e}")

    plt = _tutorial.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ends = [st[0] for st in states]
    a1.plot(np.arange(1, n + 1), x, ".", color="lightgray", label="scores x")
    a1.step(ends, [st[1] for st in states], where="pre", color="tab:red", label="running max m")
    a1.set(xlabel="keys seen", ylabel="score", title="the running maximum")
    a1.legend(fontsize=8)
    # alpha of the first block is exp(-inf) = 0: the initial state holds nothing
    a2.plot(ends[1:], [st[4] for st in states[1:]], "o-", color="tab:blue",
            label="alpha = exp(m_old - m_new)")
    a2.plot(ends, [st[2] for st in states], "s-", color="tab:green", label="l (sum of exp(x - m))")
    a2.set(xlabel="keys seen", yscale="log", title="rescaling, block by block")
    a2.legend(fontsize=8)
    _tutorial.save(fig, args, "02_online_softmax.png")
    return dict(worst=worst, states=states, kernel_err=kernel_err, lse_err=lse_err)


if __name__ == "__main__":
    main()
