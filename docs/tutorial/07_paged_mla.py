"""Chapter 7: paged MLA decode, the scheduler, split-KV and the lse combine.

Builds a latent cache in shuffled pages behind a block table, plans a batch of mixed lengths with
FlashMLA's scheduler (numba_flash/scheduler.py) and draws how its parts, blocks and splits fall,
merges the pieces of a split request with the lse rule in NumPy, and runs the decode
(get_mla_metadata + flash_mla_with_kvcache) against the float64 reference.
"""

import numpy as np

import _tutorial


def sequence_keys(k_cache, block_table, r, seqlen, head):
    """The first ``seqlen`` cache rows of request ``r``, kv head ``head``, gathered from its pages:
    row j lives in page ``block_table[r, j // page]`` at slot ``j % page``."""
    page = k_cache.shape[1]
    j = np.arange(seqlen)
    return k_cache[block_table[r, j // page], j % page, head].astype(np.float64)


def partial(q, keys, dv, scale):
    """Attention of the query rows ``q (rows, d)`` over ``keys`` alone: (O normalised over
    them, lse)."""
    s = q @ keys.T * scale
    m = s.max(-1, keepdims=True)
    w = np.exp(s - m)
    return w @ keys[:, :dv] / w.sum(-1, keepdims=True), m[:, 0] + np.log(w.sum(-1))


def main(argv=None):
    args = _tutorial.start(__doc__, argv)
    import numba_flash as nf
    from numba_flash import reference, scheduler
    from numba_flash.runtime import device

    rng = np.random.default_rng(7)
    if args.simulator:  # latent 24 + rope 8: the 512 + 64 of DeepSeek's MLA, scaled down
        seqlens, h_q, d, dv, page = [200, 5, 0], 2, 32, 24, 16
    else:
        seqlens = [int(n) for n in rng.integers(1, 8192, 63)] + [0]
        h_q, d, dv, page = 16, 576, 512, 64
    b, s_q, h_kv = len(seqlens), 1, 1
    pages_per_seq = -(-max(seqlens) // page)
    # Pages in a shuffled order: a sequence's rows are wherever the allocator put its pages.
    block_table = rng.permutation(b * pages_per_seq).reshape(b, pages_per_seq).astype(np.int32)
    k_cache = (rng.standard_normal((b * pages_per_seq, page, h_kv, d)) * 0.5).astype(np.float16)
    q = rng.standard_normal((b, s_q, h_q, d)).astype(np.float16)
    cache_seqlens = np.array(seqlens, np.int32)
    print(f"b={b} lengths {seqlens if b <= 8 else '(63 in [1, 8192) and a 0)'}, page {page}, d={d} "
          f"(V: the first {dv}), h_q={h_q}, h_kv={h_kv}")
    print("block table of request 0 (logical block -> page):", block_table[0][:8].tolist(), "...")

    # 1. The plan, on the host, and what it means for every part.
    sms = device.current().sms
    metadata, num_splits = scheduler.plan_mla(cache_seqlens, s_q * h_q // h_kv, h_kv, sms)
    pieces = [scheduler.part_pieces(row, cache_seqlens, num_splits) for row in metadata]
    print(f"\nplan for {sms} SMs: {len(metadata)} parts, payload "
          f"{scheduler.payload(scheduler.num_blocks(cache_seqlens), len(metadata))} blocks each")
    for p, row in enumerate(pieces[:8]):
        print(f"  part {p}: " + (", ".join(f"req {r} blocks {lo}-{hi}{' (split)' if cut else ''}"
                                          for r, lo, hi, _, cut in row) or "idle"))
    split = int(np.argmax(np.diff(num_splits)))
    n_split = int(np.diff(num_splits)[split])
    print(f"request {split} is cut into {n_split} pieces")

    # 2. Split-KV in NumPy: each piece alone, then the lse combine.
    scale = d ** -0.5
    keys = sequence_keys(k_cache, block_table, split, seqlens[split], 0)
    qrows = q[split, 0].astype(np.float64)
    parts = [partial(qrows, keys[scheduler.BLOCK_N * lo:scheduler.BLOCK_N * hi], dv, scale)
             for row in pieces for r, lo, hi, _, _ in row if r == split]
    lses = np.stack([lse for _, lse in parts])
    lse = lses.max(0) + np.log(np.exp(lses - lses.max(0)).sum(0))
    merged = sum(np.exp(l - lse)[:, None] * o for o, l in parts)
    whole, whole_lse = partial(qrows, keys, dv, scale)
    combine_err = float(max(np.abs(merged - whole).max(), np.abs(lse - whole_lse).max()))
    print(f"combining {len(parts)} pieces: max difference from attention over all keys "
          f"{combine_err:.1e}")

    # 3. The decode kernels: plan on the device, decode, combine.
    dev_arrays = [_tutorial.device_array(x, args.simulator)
                  for x in (q, k_cache, block_table, cache_seqlens)]
    meta, splits = nf.get_mla_metadata(dev_arrays[3], s_q * h_q // h_kv, h_kv)
    out, out_lse = nf.flash_mla_with_kvcache(*dev_arrays, dv, meta, splits)
    out, out_lse = _tutorial.host(out), _tutorial.host(out_lse)
    nf.check_errors()
    ref, ref_lse = reference.mla_decode_ref(q, k_cache, block_table, cache_seqlens, dv)
    plan_same = bool(np.array_equal(_tutorial.host(meta)[:, :7], metadata[:, :7]) and
                     np.array_equal(_tutorial.host(splits), num_splits))
    print(f"\ndevice plan equals the host plan (metadata columns 0-6, num_splits): {plan_same}")
    empty = seqlens.index(0)
    print(f"flash_mla_with_kvcache: max |out - ref| = "
          f"{np.abs(out.astype(np.float64) - ref).max():.2e}; request {empty} (length 0): lse "
          f"{out_lse[empty].ravel()[:1]}")
    tb = [float(r["tbps"]) for r in _tutorial.read_csv("mla_decode.csv")
          if r["provider"] == "nf-tc" and int(r["heads_q"]) <= 32]
    print(f"nf-tc decode on the H200 at h_q <= 32: {min(tb):.2f}-{max(tb):.2f} TB/s "
          "(mla_decode.csv)")

    # The figure: a batch of mixed lengths on the H200's 132 SMs would be too many rows to read;
    # 16 SMs and 24 requests show the same pattern.
    fig_lens = np.random.default_rng(0).integers(1, 4000, 24).astype(np.int32)
    fig_meta, fig_splits = scheduler.plan_mla(fig_lens, 1, 1, 16)
    plt = _tutorial.pyplot()
    fig, ax = plt.subplots(figsize=(11, 5))
    for p, row in enumerate(fig_meta):
        x = 0
        for r, lo, hi, _, cut in scheduler.part_pieces(row, fig_lens, fig_splits):
            ax.barh(p, scheduler.FIXED_OVERHEAD_BLOCKS, left=x, color="0.85")
            x += scheduler.FIXED_OVERHEAD_BLOCKS
            width = max(hi - lo, 1)  # a length-0 request still costs its one (empty) block
            ax.barh(p, width, left=x, color=plt.cm.tab20(r % 20), edgecolor="black",
                    hatch="//" if cut else None)
            ax.text(x + width / 2, p, str(r), ha="center", va="center", fontsize=7)
            x += width
    ax.invert_yaxis()
    ax.set(xlabel="cost in 64-key blocks (gray: the 5-block overhead of each piece)",
           ylabel="SM part",
           title="plan_mla: 24 requests of 1-4000 keys on 16 parts (hatched: split pieces)")
    _tutorial.save(fig, args, "07_schedule.png")
    return dict(inputs=(q, k_cache, block_table, cache_seqlens), dv=dv, out=out, lse=out_lse,
                ref=ref, ref_lse=ref_lse,
                combine_err=combine_err, n_split=n_split, plan_same=plan_same,
                fig_meta=fig_meta, fig_lens=fig_lens, fig_splits=fig_splits)


if __name__ == "__main__":
    main()
