"""Where a call's time goes: the host's share against the GPU's.

    python bench/host_overhead.py                  # decode b=128, s_q=1, h_q=1, seqlen 4k, 16k
    python bench/host_overhead.py --profile        # plus a cProfile of numba_flash's calls
    python bench/host_overhead.py --graph          # decode: each call replayed from a CUDA graph
    python bench/host_overhead.py --op fwd         # attention forward beside SDPA (--shapes)
    python bench/host_overhead.py --op bwd         # attention backward beside SDPA

A memory-bound decode at seqlen 4096 moves 0.6 GB in ~0.15 ms on an H200, so a few hundred
microseconds of Python per call decide what a user measures. Three times per provider and seqlen:

    host     wall time per call of 200 back-to-back calls, never waiting for the GPU: the
             Python, allocation and launch cost of one call (the lowest of five rounds)
    gpu      per-call GPU time of 20 calls queued behind a ~1 s GPU spin (torch.cuda._sleep), so
             the GPU runs them without waiting for the host
    bench    what bench_mla.py reports (triton.testing.do_bench median; it flushes L2 between
             calls, so the GPU waits for the host whenever host > the flush)

Results: host_overhead.csv (decode) or host_overhead_attention.csv (fwd, bwd) in
bench/results/<gpu>/ and a table on stdout.
"""

import argparse
import cProfile
import functools
import io
import pstats
import time

import common
import bench_attention
import bench_mla


def measure(fn, torch):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    host_ms = float("inf")
    for _ in range(5):  # the quietest of five rounds: the host's own noise is one-sided
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        host_ms = min(host_ms, (time.perf_counter() - t0) * 1e3 / 200)
        torch.cuda.synchronize()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize()
    return host_ms, start.elapsed_time(end) / 20, common.time_ms(fn)


def profile(fn, torch):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
    print(text.getvalue())


def graphed(fn, torch):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first, as torch asks): the
    replay, which re-runs its kernels for one launch's host cost."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def decode(args, torch, out):
    rows = []
    for n in (int(x) for x in args.seqlens.split(",")):
        inputs = bench_mla.make_inputs(args.batch, 1, args.heads_q, 1, 576, 64, [n] * args.batch,
                                       torch.bfloat16, 0)
        nbytes = common.mla_decode_bytes(args.batch, 1, args.heads_q, 1, 576, 512, n, 2)
        for name in (args.providers or "nf-simt,triton").split(","):
            fn = bench_mla.PROVIDERS[name]()(*inputs, 512, False)
            if args.graph:
                fn, name = graphed(fn, torch), name + "-graph"
            host, gpu, bench = measure(fn, torch)
            rows.append(dict(provider=name, heads_q=args.heads_q, seqlen=n, host_ms=host,
                             gpu_ms=gpu, bench_ms=bench, gpu_tbps=nbytes / gpu * 1e-9,
                             bench_tbps=nbytes / bench * 1e-9))
            print(f"{name:8s} h_q {args.heads_q:3d} seqlen {n:6d}: host {host:.3f} ms/call, "
                  f"gpu {gpu:.3f} ms/call "
                  f"({rows[-1]['gpu_tbps']:.2f} TB/s), bench {bench:.3f} ms "
                  f"({rows[-1]['bench_tbps']:.2f} TB/s)", flush=True)
            common.write_csv(out / "host_overhead.csv", rows)
            if args.profile and name.startswith("nf") and not args.graph:
                profile(fn, torch)
        del inputs


def attention(args, torch, out):
    """The forward or backward (``args.op``) of each provider on each B,N,H,D shape, fp16."""
    providers = bench_attention.providers_available((args.op,))
    names = (args.providers or "nf-tc,nf-simt,sdpa-flash,sdpa-cudnn").split(",")
    rows = []
    for shape in args.shapes.split(";"):
        b, n, h, d = (int(x) for x in shape.split(","))
        q, k, v, dout = bench_attention._inputs(b, n, h, d, torch.float16, seed=0)
        for name in names:
            if name not in providers:
                print(f"{name}: not available here", flush=True)
                continue
            fwd, bwd = providers[name]
            if args.op == "fwd":
                fn = functools.partial(fwd, q, k, v, args.causal)
            elif bwd is not None:
                fn = bwd(q, k, v, dout, args.causal)
            else:
                continue
            host, gpu, bench = measure(fn, torch)
            rows.append(dict(op=args.op, provider=name, shape=shape.replace(",", "x"),
                             causal=args.causal, host_ms=host, gpu_ms=gpu, bench_ms=bench))
            print(f"{args.op} {name:10s} {shape:18s}: host {host * 1e3:7.1f} us/call, "
                  f"gpu {gpu * 1e3:8.1f} us/call, bench {bench * 1e3:8.1f} us", flush=True)
            common.write_csv(out / "host_overhead_attention.csv", rows)
            if args.profile and name.startswith("nf"):
                profile(fn, torch)
        del q, k, v, dout


def main():
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--op", choices=("decode", "fwd", "bwd"), default="decode")
    p.add_argument("--seqlens", default="4096,16384", help="decode: cache lengths")
    p.add_argument("--batch", type=int, default=128, help="decode: requests")
    p.add_argument("--heads-q", type=int, default=1, help="decode: query heads")
    p.add_argument("--shapes", default="1,128,8,64;4,4096,16,128",
                   help="fwd, bwd: B,N,H,D shapes separated by ';'")
    p.add_argument("--causal", action="store_true", help="fwd, bwd: causal")
    p.add_argument("--providers", default=None, help="default: nf-simt,triton (decode); "
                   "nf-tc,nf-simt,sdpa-flash,sdpa-cudnn (fwd, bwd)")
    p.add_argument("--profile", action="store_true", help="cProfile 100 numba_flash calls")
    p.add_argument("--graph", action="store_true",
                   help="decode: time the replay of each call captured in a CUDA graph")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()
    out = common.results_dir(args.out_dir)
    (decode if args.op == "decode" else attention)(args, torch, out)


if __name__ == "__main__":
    main()
