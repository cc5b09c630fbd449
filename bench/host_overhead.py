"""Where a decode call's time goes: the host's share against the GPU's.

    python bench/host_overhead.py                  # b=128, s_q=1, h_q=1, seqlen 4096 and 16384
    python bench/host_overhead.py --profile        # plus a cProfile of numba_flash's calls

A memory-bound decode at seqlen 4096 moves 0.6 GB in ~0.15 ms on an H200, so a few hundred
microseconds of Python per call decide what a user measures. Three times per provider and seqlen:

    host     wall time per call of 200 back-to-back calls, never waiting for the GPU: the
             Python, allocation and launch cost of one call
    gpu      per-call GPU time of 20 calls queued behind a ~1 s GPU spin (torch.cuda._sleep), so
             the GPU runs them without waiting for the host
    bench    what bench_mla.py reports (triton.testing.do_bench median; it flushes L2 between
             calls, so the GPU waits for the host whenever host > the flush)

Results: host_overhead.csv in bench/results/<gpu>/ and a table on stdout.
"""

import argparse
import cProfile
import io
import pstats
import time

import common
import bench_mla


def measure(fn, torch):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / 200
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize()
    return host_ms, start.elapsed_time(end) / 20, common.time_ms(fn)


def main():
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--heads-q", type=int, default=1)
    p.add_argument("--providers", default="nf-simt,triton")
    p.add_argument("--profile", action="store_true", help="cProfile 100 numba_flash calls")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()

    out = common.results_dir(args.out_dir)
    rows = []
    for n in (int(x) for x in args.seqlens.split(",")):
        inputs = bench_mla.make_inputs(args.batch, 1, args.heads_q, 1, 576, 64, [n] * args.batch,
                                       torch.bfloat16, 0)
        nbytes = common.mla_decode_bytes(args.batch, 1, args.heads_q, 1, 576, 512, n, 2)
        for name in args.providers.split(","):
            fn = bench_mla.PROVIDERS[name]()(*inputs, 512, False)
            host, gpu, bench = measure(fn, torch)
            rows.append(dict(provider=name, seqlen=n, host_ms=host, gpu_ms=gpu, bench_ms=bench,
                             gpu_tbps=nbytes / gpu * 1e-9, bench_tbps=nbytes / bench * 1e-9))
            print(f"{name:8s} seqlen {n:6d}: host {host:.3f} ms/call, gpu {gpu:.3f} ms/call "
                  f"({rows[-1]['gpu_tbps']:.2f} TB/s), bench {bench:.3f} ms "
                  f"({rows[-1]['bench_tbps']:.2f} TB/s)", flush=True)
            common.write_csv(out / "host_overhead.csv", rows)
            if args.profile and name.startswith("nf"):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(100):
                    fn()
                prof.disable()
                torch.cuda.synchronize()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
                print(text.getvalue())
        del inputs


if __name__ == "__main__":
    main()
