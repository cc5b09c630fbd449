"""Context-parallel benchmark: numba_flash's ring attention on W GPUs against the single-GPU
kernel at the same tokens per GPU, and against torch's own ``context_parallel`` with SDPA's
cuDNN backend at the same shapes (the issue's targets: >= 0.9x the single-GPU kernel per GPU
at 32k tokens per GPU, communication hidden; >= 1.0x torch's).

    torchrun --nproc-per-node 8 bench/bench_context_parallel.py
    torchrun --nproc-per-node 2 bench/bench_context_parallel.py --tokens-per-gpu 32768 --modes fwd

Each point: B = 1 sequence of ``tokens_per_gpu * W`` tokens, Hq = Hk = hidden / D heads of D,
bf16, causal (zigzag layout for numba_flash; torch's ``context_parallel`` shards with its own
load balancing). Before timing, rank 0 checks numba_flash's output and gradients gathered from
every rank against the unsplit single-GPU call on the whole sequence (when it fits one GPU).
Providers, per GPU TFLOP/s (the whole sequence's FLOPs / W / time):
    nf-ring        numba_flash.distributed.ring_flash_attn_func
    nf-single      numba_flash.torch.flash_attn_func on one GPU's share: a sequence of
                   tokens_per_gpu tokens (the work per GPU without communication)
    torch-cp       torch.distributed.tensor.experimental.context_parallel around SDPA (cuDNN)
Results (rank 0): context_parallel.csv in bench/results/<gpu>/, with W in each row.
"""

import argparse
import os
import statistics
import sys

import common

PROVIDERS = ("nf-ring", "nf-single", "torch-cp")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--tokens-per-gpu", default="8192,32768")
    p.add_argument("--head-dims", default="128")
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--causal", default="1", help="comma-separated 0/1")
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def per_gpu_tflops(tokens_per_gpu, world, heads, head_dim, causal, mode, ms):
    """The whole sequence's attention FLOPs, shared by ``world`` GPUs, per GPU and second."""
    n = tokens_per_gpu * world
    flops = common.attention_flops(1, heads, n, n, head_dim, causal, mode)
    return flops / world / (ms * 1e-3) / 1e12


def shard(x, rank, world, layout="zigzag"):
    """Rank ``rank``'s rows of ``x`` (B, N, H, D) as numba_flash.distributed deals them out."""
    import torch
    from numba_flash import distributed as nfd

    s = x.shape[1] // world
    return torch.cat([x[:, g:g + c] for _, g, c in nfd.chunks(rank, world, s, layout)], 1)


def _timed(fn, dist):
    """Median ms of ``fn`` on every rank (the slowest rank's is the step's), after warm-up."""
    import torch

    dist.barrier()
    ms = common.time_ms(fn)
    t = torch.tensor([ms], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _check(q, k, v, dout, causal, world, rank, dist):
    """numba_flash's ring against the unsplit call: max |difference| of out, dq, dk, dv over
    every rank's shard (rank 0 holds the answer)."""
    import torch
    import numba_flash.torch as nft
    from numba_flash import distributed as nfd

    local = [shard(t, rank, world).detach().requires_grad_() for t in (q, k, v)]
    out = nfd.ring_flash_attn_func(*local, causal=causal)
    out.backward(shard(dout, rank, world))
    whole = [t.detach().requires_grad_() for t in (q, k, v)]
    ref = nft.flash_attn_func(*whole, causal=causal)
    ref.backward(dout)
    err = max((a - shard(b, rank, world)).abs().max().item() for a, b in
              ((out, ref), *((t.grad, w.grad) for t, w in zip(local, whole))))
    t = torch.tensor([err], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    import numba_flash.torch as nft
    from numba_flash import distributed as nfd

    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    providers = [p for p in args.providers.split(",") if p in PROVIDERS]
    rows, out_dir = [], common.results_dir(args.out_dir) if rank == 0 else None
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    for mode in args.modes.split(","):
        for d in map(int, args.head_dims.split(",")):
            heads = args.hidden // d
            for per_gpu in map(int, args.tokens_per_gpu.split(",")):
                for causal in (c == "1" for c in args.causal.split(",")):
                    n = per_gpu * world
                    q, k, v, dout = (torch.randn(1, n, heads, d, device="cuda",
                                                 dtype=torch.bfloat16, generator=g)
                                     for _ in range(4))
                    err = _check(q, k, v, dout, causal, world, rank, dist)
                    calls = {}
                    local = [shard(t, rank, world).detach().requires_grad_() for t in (q, k, v)]
                    one = [t[:, :per_gpu].detach().requires_grad_() for t in (q, k, v)]
                    if "nf-ring" in providers:
                        calls["nf-ring"] = _call(mode, lambda: nfd.ring_flash_attn_func(
                            *local, causal=causal), shard(dout, rank, world))
                    if "nf-single" in providers:
                        calls["nf-single"] = _call(mode, lambda: nft.flash_attn_func(
                            *one, causal=causal), dout[:, :per_gpu])
                    close = None
                    if "torch-cp" in providers:
                        calls["torch-cp"], close = _torch_cp(mode, q, k, v, dout, causal, world)
                    times = {name: [] for name in calls}
                    try:
                        for rnd in range(args.repeats):
                            for name in common.rotated(list(calls), rnd):
                                times[name].append(_timed(calls[name], dist))
                    finally:
                        if close is not None:
                            close()
                    for name, ts in times.items():
                        ms = statistics.median(ts)
                        rows.append(dict(mode=mode, world=world, head_dim=d, tokens_per_gpu=per_gpu,
                                         causal=int(causal), provider=name, ms=ms,
                                         tflops_per_gpu=per_gpu_tflops(per_gpu, world, heads, d,
                                                                       causal, mode, ms),
                                         max_err=err if name == "nf-ring" else ""))
                    if rank == 0:
                        common.write_csv(out_dir / "context_parallel.csv", rows)
                        print(f"{mode} D={d} {per_gpu} tokens/GPU causal={int(causal)} W={world}: "
                              + ", ".join(f"{r['provider']} {r['tflops_per_gpu']:.0f}"
                                          for r in rows[-len(times):])
                              + f" (ring vs unsplit max err {err:.3g})", flush=True)
    dist.destroy_process_group()


def _call(mode, forward, dout):
    """The timed call: the forward, or forward and backward (``bwd``: the step's attention)."""
    if mode == "fwd":
        return forward

    def step():
        forward().backward(dout)
    return step


def _torch_cp(mode, q, k, v, dout, causal, world):
    """torch's context parallelism: SDPA (cuDNN) inside ``context_parallel`` over a 1-D mesh of
    the W GPUs, with (B, H, N, D) buffers sharded on their sequence dimension."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mesh = init_device_mesh("cuda", (world,))
    bufs = [t.transpose(1, 2).contiguous() for t in (q, k, v, dout)]
    # The context shards the buffers in place on entry and keeps SDPA's dispatch to its ring
    # while open: it stays open for the point's timed calls (``close`` ends it).
    context = context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2],
                               no_restore_buffers=set(bufs))
    context.__enter__()
    qs, ks, vs = (b.detach().requires_grad_(mode != "fwd") for b in bufs[:3])

    def step():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        if mode != "fwd":
            out.backward(bufs[3])
        return out
    return step, lambda: context.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
