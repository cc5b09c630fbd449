"""Chapter 4: the real SIMT forward, numba_flash/kernels/simt/forward.py.

Everything here is computed from the kernel's own tile tables and layout functions: the
shared-memory words each thread reads per multiply-add with and without register micro-tiles,
the bank conflicts that the padding of its shared tiles removes, and the causal tiles it skips.
Then the kernel runs against the float64 reference.
"""

import numpy as np

import _tutorial

BANKS = 32  # shared memory serves one 4-byte word per bank per cycle


def conflict_ways(addresses):
    """Cycles one warp-wide shared access takes: the most distinct words that fall on one bank
    (threads reading the same word share it, a broadcast)."""
    words = np.unique(np.asarray(addresses))
    return int(np.bincount(words % BANKS, minlength=BANKS).max())


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    from numba_flash import reference
    from numba_flash.kernels.common.masks import make_kv_end, make_needs_mask
    from numba_flash.kernels.simt import forward
    from numba_flash.kernels.simt.tiles import LANES_PER_ROW, ROW_GROUPS, row_pad

    # 1. Shared words per FMA. Rowwise: each score term reads one Q and one K word; each PV term
    #    one V word. Micro-tile of TM x TN: TM + TN words per step serve TM * TN FMAs.
    print("shared-memory words read per FMA, per thread")
    print(f"{'D':>4} {'tile':>7} {'TM x TN':>8} {'TM x TD':>8} {'QK^T':>7} {'PV':>7} "
          f"{'rowwise QK^T':>13} {'rowwise PV':>11}")
    traffic = {}
    for limit, (bm, bn) in forward.TILES:
        tm, tn, td = bm // ROW_GROUPS, bn // LANES_PER_ROW, limit // LANES_PER_ROW
        qk, pv = (tm + tn) / (tm * tn), (tm + td) / (tm * td)
        traffic[limit] = (qk, pv, 2.0, 1.0 + 1.0 / limit)
        print(f"{limit:>4} {bm:>3}x{bn:<3} {tm:>4}x{tn:<3} {tm:>4}x{td:<3} {qk:>7.3f} {pv:>7.3f} "
              f"{2.0:>13.3f} {1 + 1 / limit:>11.3f}")

    # 2. Bank conflicts, D = 64 tile: one warp (lanes 0..31 = four row groups of 8 lanes).
    bm, bn = forward.TILES[0][1]
    d = forward.TILES[0][0]
    tm = bm // ROW_GROUPS
    lanes = np.arange(32)
    row0, lane = (lanes >> 3) * tm, lanes & (LANES_PER_ROW - 1)
    pad = row_pad(tm, bn)
    banks = {}
    print(f"\nbank conflicts at D = {d}, tile {bm} x {bn} (cycles per warp access; 1 is ideal)")
    strides = (("P stride BLOCK_N (no pad)", bn), (f"P stride BLOCK_N + {pad}", bn + pad))
    for name, stride in strides:
        read = row0 * stride          # PV reads P[row0 + i][c]: one word per row group
        write = row0 * stride + lane  # the softmax writes P[row0 + i][lane + 8 j]
        banks[name] = read % BANKS
        print(f"  {name:<26} P read {conflict_ways(read)}-way, P write {conflict_ways(write)}-way")
    # The tile loader stores Q^T: a warp's 32 consecutive elements of one row go down a column.
    for stride in (bm, bm + 1):
        print(f"  Q^T column stride {stride:<3}        transposing write "
              f"{conflict_ways(lanes * stride)}-way")

    # 3. Causal tile skipping: which (query tile, key tile) pairs run, masked or not.
    n = 256 if args.simulator else 4096
    kv_end = make_kv_end(bm, True).py_func
    needs_mask = make_needs_mask(bn, True).py_func
    tiles_q, tiles_k = -(-n // bm), -(-n // bn)
    state = np.zeros((tiles_q, tiles_k), int)  # 0 skipped, 1 full, 2 masked
    for i in range(tiles_q):
        for j in range(0, kv_end(i * bm, 0, n), bn):
            state[i, j // bn] = 2 if needs_mask(j, i * bm, 0, n) else 1
    counts = {name: int((state == s).sum()) for s, name in enumerate(("skipped", "full", "masked"))}
    print(f"\ncausal, N = {n}, {bm} x {bn} tiles: {counts['full']} computed unmasked, "
          f"{counts['masked']} masked, {counts['skipped']} never loaded "
          f"({counts['skipped'] / state.size:.0%} of the {state.size})")

    # 4. The kernel itself.
    B, S, H, D = (1, 70, 1, 24) if args.simulator else (2, 2048, 8, 64)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float16) for _ in range(3))
    import numba_flash as nf

    out, lse = nf.flash_attn_fwd(*(_tutorial.device_array(x, args.simulator) for x in (q, k, v)),
                                 causal=True, backend="simt")
    out, lse = _tutorial.host(out), _tutorial.host(lse)
    ref, ref_lse = reference.attention_fwd_ref(q, k, v, True)
    print(f"\nflash_fwd_simt, B={B} S={S} H={H} D={D} causal: max |out - ref| = "
          f"{np.abs(out.astype(np.float64) - ref).max():.2e}")

    plt = _tutorial.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw=dict(width_ratios=(1.3, 1)))
    for y, (name, b) in enumerate(banks.items()):
        a1.scatter(lanes, np.full(32, y), c=b, cmap="tab20", vmin=0, vmax=31, s=120, marker="s")
        for x in range(0, 32, 8):
            a1.annotate(f"bank {b[x]}", (x + 3.5, y + 0.25), ha="center", fontsize=8)
    a1.set(yticks=range(len(banks)), yticklabels=list(banks), xlabel="lane",
           title="banks of one warp's P reads (8 lanes per row group)", ylim=(-0.5, 1.8))
    a2.imshow(state, cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange"]),
              vmin=0, vmax=2)
    a2.set(xlabel=f"key tile ({bn} keys)", ylabel=f"query tile ({bm} rows)",
           xticks=range(tiles_k), yticks=range(tiles_q),
           title=f"causal N = {n}: full (blue), masked (orange), skipped")
    _tutorial.save(fig, args, "04_banks_and_causal_tiles.png")
    return dict(q=q, k=k, v=v, out=out, lse=lse, ref=ref, ref_lse=ref_lse, traffic=traffic,
                counts=counts, state=state,
                ways={"nopad": conflict_ways(row0 * bn), "pad": conflict_ways(row0 * (bn + pad))})


if __name__ == "__main__":
    main()
