"""KV-cache decode benchmark: numba_flash.flash_attn_with_kvcache on a paged GQA cache, eager and
replayed from a CUDA graph, against the device copy bandwidth and SDPA on gathered K/V.

    python bench/bench_kvcache.py                        # B 64, Hq 32, Hk 8, D 128, 1k..32k
    python bench/bench_kvcache.py --seqlens 4096,16384 --pages 64 --repeats 5

One decode step: every sequence appends one new key and value (at position L - 1) and its one
query token attends all L keys of its cache (pages of --pages rows, a random permutation of the
pool, bfloat16). Providers:
    nf-graph     the step captured once in a CUDA graph and replayed (the serving path)
    nf-eager     the step called from Python, calls queued back to back (host time included
                 where it exceeds the GPU's)
    nf-graph-fp8 nf-graph on float8_e4m3fn caches (descales 2^-5 per sequence and kv head; the
                 16-bit caches of the other providers then hold the same values, e4m3 times
                 2^-5 being exact in bfloat16, so the outputs agree but for the appended key)
    sdpa-gather  torch: K/V gathered from the pages (k_cache[block_table]) and
                 scaled_dot_product_attention with enable_gqa (the naive baseline; no append)
Every provider's output is first compared with numba_flash.reference.kvcache_ref on a small
point, then, at each point, with nf-graph's. Columns: ms (median of --repeats alternating
rounds), TB/s = the bytes a step must move (the K and V caches read once, q, the new k, v and
out; an FP8 cache's bytes are one per element) over the time, vs_copy = TB/s over the
device-to-device copy bandwidth measured in the same run, tokens_s = sequences decoded per
second (B / ms), host_us = Python's time per eager call (no synchronization). Results: kvcache.csv and
kvcache.png (TB/s against the cache length, one panel per page size) in bench/results/<gpu>/.
"""

import argparse
import statistics
import sys
import time

import common

COPY_BYTES = 2 << 30


FP8_DESCALE = 2.0 ** -5  # stored e4m3 values of the bench's N(0, 1) keys: up to ~150


def step_bytes(b, hq, hk, d, seqlen, elem=2, cache_elem=None):
    """Bytes one decode step must move: both caches read (``cache_elem`` bytes a value,
    default ``elem``), q, new k and v, out."""
    cache_elem = elem if cache_elem is None else cache_elem
    return cache_elem * 2 * b * seqlen * hk * d + elem * (2 * b * hq * d + 2 * b * hk * d)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads-q", type=int, default=32)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlens", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--pages", default="16,64")
    p.add_argument("--providers", default="nf-graph,nf-eager,sdpa-gather")
    p.add_argument("--num-splits", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def copy_bandwidth():
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / common.time_ms(lambda: dst.copy_(src)) * 1e-9


def make_point(args, seqlen, page, g):
    import torch

    b, hk, d = args.batch, args.heads_kv, args.head_dim
    per_seq = -(-seqlen // page)
    bf = torch.bfloat16
    x = dict(q=torch.randn(b, 1, args.heads_q, d, device="cuda", generator=g, dtype=bf),
             k_cache=torch.randn(b * per_seq, page, hk, d, device="cuda", generator=g, dtype=bf),
             v_cache=torch.randn(b * per_seq, page, hk, d, device="cuda", generator=g, dtype=bf),
             k=torch.randn(b, 1, hk, d, device="cuda", generator=g, dtype=bf),
             v=torch.randn(b, 1, hk, d, device="cuda", generator=g, dtype=bf))
    perm = torch.randperm(b * per_seq, device="cuda", generator=g).to(torch.int32)
    x["block_table"] = perm.view(b, per_seq)
    x["cache_seqlens"] = torch.full((b,), seqlen - 1, dtype=torch.int32, device="cuda")
    return x


def fp8_point(x):
    """``x`` with its caches rounded to float8_e4m3fn (descale FP8_DESCALE), and ``x``'s own
    16-bit caches overwritten with the same values (exact in bfloat16)."""
    import torch

    b, hk = x["q"].shape[0], x["k_cache"].shape[2]
    y = dict(x)
    for name in ("k_cache", "v_cache"):
        y[name] = (x[name].float() / FP8_DESCALE).clamp(-448, 448).to(torch.float8_e4m3fn)
        x[name].copy_(y[name].float() * FP8_DESCALE)
    for name in ("k_descale", "v_descale"):
        y[name] = torch.full((b, hk), FP8_DESCALE, dtype=torch.float32, device="cuda")
    return y


def nf_step(x, num_splits):
    import numba_flash as nf

    return lambda: nf.flash_attn_with_kvcache(
        x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], cache_seqlens=x["cache_seqlens"],
        block_table=x["block_table"], num_splits=num_splits, k_descale=x.get("k_descale"),
        v_descale=x.get("v_descale"))


def graph_step(x, num_splits):
    import torch

    step = nf_step(x, num_splits)
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph.replay, out


def sdpa_gather(x):
    import torch.nn.functional as F

    lengths = int(x["cache_seqlens"][0]) + 1

    def run():
        k = x["k_cache"][x["block_table"]].flatten(1, 2)[:, :lengths]  # (b, L, hk, d)
        v = x["v_cache"][x["block_table"]].flatten(1, 2)[:, :lengths]
        return F.scaled_dot_product_attention(x["q"].transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), enable_gqa=True).transpose(1, 2)
    return run


def check_small(fp8=False):
    """nf against kvcache_ref (float64) on a small paged GQA step (``fp8``: FP8 caches)."""
    import ml_dtypes
    import numpy as np
    import torch
    import numba_flash as nf
    from numba_flash import reference as ref

    rng = np.random.default_rng(1)
    b, hq, hk, d, page = 3, 8, 2, 64, 16
    host = [rng.standard_normal(s).astype(np.float32) for s in (
        (b, 1, hq, d), (b * 8, page, hk, d), (b * 8, page, hk, d), (b, 1, hk, d), (b, 1, hk, d))]
    table = rng.permutation(b * 8).astype(np.int32).reshape(b, 8)
    lens = np.array([5, 127, 60], np.int32)
    t = [torch.from_numpy(h).cuda().to(torch.bfloat16) for h in host]
    scales = {}
    if fp8:
        t[1:3] = [(c.float() / FP8_DESCALE).to(torch.float8_e4m3fn) for c in t[1:3]]
        scales = {name: torch.full((b, hk), FP8_DESCALE, device="cuda")
                  for name in ("k_descale", "v_descale")}
    host = [x.cpu().view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
            if x.dtype == torch.float8_e4m3fn else x.float().cpu().numpy() for x in t]
    out = nf.flash_attn_with_kvcache(*t, cache_seqlens=torch.from_numpy(lens).cuda(),
                                     block_table=torch.from_numpy(table).cuda(), **scales)
    want = ref.kvcache_ref(*host, cache_seqlens=lens, block_table=table,
                           **{name: s.cpu().numpy() for name, s in scales.items()})[0]
    err = float(np.abs(out.float().cpu().numpy() - want).max())
    nf.check_errors()
    return err


def main(argv=None):
    import torch

    args = parse_args(argv)
    names = args.providers.split(",")
    fp8 = "nf-graph-fp8" in names
    for cache in (False, True) if fp8 else (False,):
        err = check_small(cache)
        print(f"nf{' (FP8 caches)' if cache else ''} against kvcache_ref: max error {err:.3g}",
              flush=True)
        if not err < 2e-2:
            print("numba_flash disagrees with the reference: no timings", flush=True)
            return 1
    copy_tbps = copy_bandwidth()
    print(f"device copy bandwidth: {copy_tbps:.2f} TB/s (read + written)", flush=True)
    points = [(p, s) for p in map(int, args.pages.split(","))
              for s in map(int, args.seqlens.split(","))]
    progress = common.Progress(len(points))
    rows, out_dir = [], common.results_dir(args.out_dir)
    for page, seqlen in points:
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        x = make_point(args, seqlen, page, g)
        runs, outs = {}, {}  # a graph's replay returns nothing: its output buffer is outs'
        if fp8:  # (before the other providers' graphs: it rewrites x's caches)
            runs["nf-graph-fp8"], outs["nf-graph-fp8"] = graph_step(fp8_point(x),
                                                                    args.num_splits)
        replay, graph_out = graph_step(x, args.num_splits)
        outs["nf-graph"] = graph_out
        if "nf-graph" in names:
            runs["nf-graph"] = replay
        if "nf-eager" in names:
            runs["nf-eager"] = nf_step(x, args.num_splits)
        if "sdpa-gather" in names:
            runs["sdpa-gather"] = sdpa_gather(x)
        replay()
        want = graph_out.float()
        for name, run in list(runs.items()):
            result = run()
            got = outs.get(name, result)
            err = (got.float() - want).abs().max().item()
            if not err <= 2e-2:
                print(f"  {name}: differs from nf-graph by {err:.3g}; left out", flush=True)
                del runs[name]
        samples = {name: [] for name in runs}
        for rnd in range(args.repeats):
            for name in common.rotated(list(runs), rnd):
                samples[name].append(common.time_ms(runs[name]))
        host_us = float("nan")
        if "nf-eager" in runs:
            step = runs["nf-eager"]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                step()
            host_us = (time.perf_counter() - t0) / 50 * 1e6
            torch.cuda.synchronize()
        for name, ms in samples.items():
            nbytes = step_bytes(args.batch, args.heads_q, args.heads_kv, args.head_dim, seqlen,
                                cache_elem=1 if name.endswith("fp8") else 2)
            ms = statistics.median(ms)
            tbps = nbytes / ms * 1e-9
            rows.append(dict(page=page, seqlen=seqlen, provider=name, ms=ms, tbps=tbps,
                             vs_copy=tbps / copy_tbps, copy_tbps=copy_tbps,
                             tokens_s=args.batch / ms * 1e3,
                             host_us=host_us if name == "nf-eager" else "",
                             num_splits=args.num_splits))
        common.write_csv(out_dir / "kvcache.csv", rows)
        progress.step(f"page {page} L {seqlen}: " + ", ".join(
            f"{r['provider']} {r['tbps']:.2f}" for r in rows[-len(samples):]) + " TB/s")
        del x, runs, replay, graph_out
        torch.cuda.empty_cache()
    print(common.format_table(rows, ["page", "seqlen", "provider", "ms", "tbps", "vs_copy",
                                     "tokens_s", "host_us"]))
    if not args.no_plot:
        common.plot_panels(out_dir / "kvcache.png", rows, "seqlen", "tbps", ["page"], "provider",
                           "cache length", "TB/s",
                           f"KV-cache decode, B {args.batch}, Hq {args.heads_q}, Hk "
                           f"{args.heads_kv}, D {args.head_dim}, bf16, {common.gpu_name()}",
                           hline=(copy_tbps, "copy"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
