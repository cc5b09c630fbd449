"""The per-rank side of tests/test_distributed.py, in a module the spawned ranks can import
(pytest's importlib mode gives test modules names no other process resolves)."""

import os

import numpy as np
import torch
import torch.distributed as dist

from numba_flash import distributed as nfd

B, S, HQ, HK, D = 1, 4, 2, 1, 8  # S rows per rank: two chunks of 2 in the zigzag layout
# (causal, layout, window_size) by world size: between them both layouts, causal or not, windows
# with one and two sides (test_distributed.py's one-process tests add causal zigzag alone).
CASES = {2: [(True, "zigzag", (3, -1))], 3: [(False, "contiguous", (2, 1))]}
# Packed sequences (llama3_flash_attn_varlen_func): lengths that the ranks' equal runs of 8
# tokens cut, (causal, window_size) cases by world size.
LENGTHS = [3, 7, 6]
VARLEN_CASES = {2: [(True, (3, -1)), (False, (-1, -1))], 3: []}


def _shard(x, rank, world, layout):
    return np.concatenate([x[:, g:g + n] for _, g, n in nfd.chunks(rank, world, S, layout)],
                          axis=1)


def check_ring(rank, world, port, seed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from numba_flash import reference as ref

        rng = np.random.default_rng(seed)
        n = S * world
        q, k, v, dout = (rng.standard_normal(shape).astype(np.float32) for shape in
                         ((B, n, HQ, D), (B, n, HK, D), (B, n, HK, D), (B, n, HQ, D)))
        for causal, layout, window in CASES[world]:
            mask = ref.window_mask(n, n, window, causal)
            want = ref.attention_fwd_ref(q, k, v, mask=mask)[0]
            grads = ref.attention_bwd_ref(dout, q, k, v, mask=mask)
            local = [torch.from_numpy(_shard(x, rank, world, layout)).requires_grad_()
                     for x in (q, k, v)]
            out = nfd.ring_flash_attn_func(*local, causal=causal, window_size=window,
                                           layout=layout)
            out.backward(torch.from_numpy(_shard(dout, rank, world, layout)))
            what = f"rank {rank} of {world}, causal {causal}, {layout}, window {window}"
            np.testing.assert_allclose(out.detach().numpy(), _shard(want, rank, world, layout),
                                       atol=2e-5, err_msg="out: " + what)
            for name, t, g in zip("qkv", local, grads):
                np.testing.assert_allclose(t.grad.numpy(), _shard(g, rank, world, layout),
                                           atol=5e-5, err_msg=f"d{name}: " + what)
        check_varlen(rank, world, rng)
    finally:
        dist.destroy_process_group()


def check_varlen(rank, world, rng):
    from numba_flash import reference as ref

    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
    t = int(cu[-1])
    rows = slice(rank * t // world, (rank + 1) * t // world)
    q, k, v, dout = (rng.standard_normal(shape).astype(np.float32) for shape in
                     ((t, HQ, D), (t, HK, D), (t, HK, D), (t, HQ, D)))
    for causal, window in VARLEN_CASES[world]:
        mask = ref.varlen_mask(cu, cu, t, t, causal, window_size=window)
        want = ref.attention_fwd_ref(q[None], k[None], v[None], mask=mask)[0][0]
        grads = [g[0] for g in ref.attention_bwd_ref(dout[None], q[None], k[None], v[None],
                                                     mask=mask)]
        local = [torch.from_numpy(x[rows]).requires_grad_() for x in (q, k, v)]
        out = nfd.llama3_flash_attn_varlen_func(*local, cu_seqlens=torch.from_numpy(cu),
                                                causal=causal, window_size=window)
        out.backward(torch.from_numpy(dout[rows]))
        what = f"varlen rank {rank} of {world}, causal {causal}, window {window}"
        np.testing.assert_allclose(out.detach().numpy(), want[rows], atol=2e-5,
                                   err_msg="out: " + what)
        for name, x, g in zip("qkv", local, grads):
            np.testing.assert_allclose(x.grad.numpy(), g[rows], atol=5e-5,
                                       err_msg=f"d{name}: " + what)


