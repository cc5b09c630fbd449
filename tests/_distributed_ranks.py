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
    finally:
        dist.destroy_process_group()


