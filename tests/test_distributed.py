"""distributed.py: ring attention over torch.distributed. ``band_call`` against the band of
visible offsets it stands for, element by element; and the ring itself in several processes
(gloo, CPU tensors; the kernels under the simulator without a GPU), world sizes 2 and 3, every
layout, causal or not, with a window: each rank's output and its dq, dk, dv against the float64
reference of the whole sequence, sliced as the rank holds it; packed sequences cut by the
ranks' runs (the all-gather variant) the same way."""

import socket

import numpy as np
import pytest

from helpers import SIMULATOR

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from numba_flash import distributed as nfd  # noqa: E402  (after the torch check)


def _band_mask(q0, sq, k0, sk, left, right):
    i, j = np.arange(sq)[:, None] + q0, np.arange(sk)[None, :] + k0
    off = j - i
    return (off >= -left if left >= 0 else True) & (off <= right if right >= 0 else True) \
        & np.ones((sq, sk), bool)


def _flash_mask(sq, sk, call):
    """The mask a flash-attn call of ``band_call``'s answer applies, over the whole block."""
    from numba_flash import reference as ref

    mask = np.zeros((sq, sk), bool)
    if call is not None:
        (qa, qb), (ka, kb), window = call
        mask[qa:qb, ka:kb] = ref.window_mask(qb - qa, kb - ka, window)
    return mask


def test_band_call_masks_exactly_the_band():
    """Every block of small chunks at offsets before, on and after the diagonal, for every
    window side from unbounded to past the chunks: the flash-attn call's mask (rows and keys
    it keeps, its bottom-right window) equals the band; an empty band gives no call."""
    for sq, sk in ((3, 3), (4, 2), (2, 5)):
        for q0 in range(0, 13, 3):
            for k0 in range(0, 13, 2):
                for left in (-1, 0, 1, 2, 4, 9):
                    for right in (-1, 0, 1, 3, 9):
                        call = nfd.band_call(q0, sq, k0, sk, left, right)
                        want = _band_mask(q0, sq, k0, sk, left, right)
                        got = _flash_mask(sq, sk, call)
                        assert (got == want).all(), (q0, sq, k0, sk, left, right, call)
                        assert (call is None) == (not want.any())
                        if call is not None:
                            assert all(x >= -1 for x in call[2])


def test_local_pieces_cut_the_sequences_at_the_ranks_rows():
    """Lengths 3, 7, 6 over two ranks of 8 rows: rank 0 holds sequence 0 and the first five
    rows of sequence 1, rank 1 the last two of sequence 1 and sequence 2."""
    cu = [0, 3, 10, 16]
    assert nfd.local_pieces(cu, 0, 8, True) == ([0, 3, 8], [0, 3, 16], [3, 5], 5, 5)
    assert nfd.local_pieces(cu, 8, 16, True) == ([0, 2, 8], [3, 10, 16], [7, 6], 6, 7)
    assert nfd.local_pieces(cu, 8, 16, False) == ([0, 2, 8], [3, 10, 16], [7, 6], 6, 7)
    assert nfd.local_pieces(cu, 0, 8, False) == ([0, 3, 8], [0, 3, 16], [3, 7], 5, 7)


def test_chunks_deal_the_sequence_out_once():
    for world in (1, 2, 3):
        for layout in nfd.LAYOUTS:
            rows = sorted(g for r in range(world)
                          for _, start, n in nfd.chunks(r, world, 4, layout)
                          for g in range(start, start + n))
            assert rows == list(range(4 * world))


# ----------------------------------------------------------------------------- the ring

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not SIMULATOR, reason="CPU tensors in gloo: the simulator's kernels")
@pytest.mark.parametrize("world", [2, 3])
def test_the_ring_matches_attention_over_the_whole_sequence(world):
    """Each rank checks its own shard (``_distributed_ranks.check_ring``); a failing rank's
    traceback ends the spawn."""
    import torch.multiprocessing as mp

    import _distributed_ranks

    mp.spawn(_distributed_ranks.check_ring, args=(world, _free_port(), 7 + world), nprocs=world)


def test_refusals_name_the_argument():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="layout"):
        nfd.ring_flash_attn_func(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="process group"):
        nfd.ring_flash_attn_func(q, q, q)


class _OneProcessRing:
    """The ring as rank ``rank`` sees it, with every rank's K/V in this process: ``pass_on``
    hands over the next block in the ring's order, as the previous rank would."""

    def __init__(self, rank, world, blocks):
        self.rank, self.world, self.blocks, self.step = rank, world, blocks, 0

    def pass_on(self, tensors):
        self.step += 1
        return self.blocks[(self.rank - self.step) % self.world], []


def test_merged_blocks_equal_the_whole_call(rng):
    """The forward's merge at real sizes on a GPU (tiny ones under the simulator): every rank's
    shard of the output and lse, merged from the blocks of W ranks in one process, equals the
    unsplit call's, to the kernels' own error against the float64 reference."""
    import numba_flash as nf
    from numba_flash import reference as ref

    world, n, h, d, dtype = (2, 8, 1, 8, torch.float32) if SIMULATOR else \
        (4, 4096, 8, 128, torch.bfloat16)
    device = "cpu" if SIMULATOR else "cuda"
    q, k, v = (torch.from_numpy(rng.standard_normal((1, n, h, d)).astype(np.float32))
               .to(device=device, dtype=dtype) for _ in range(3))
    for causal, layout, window in ((True, "zigzag", (-1, -1)), (False, "contiguous", (700, 30))):
        mask = ref.window_mask(n, n, window, causal)
        host = [t.float().cpu().numpy() for t in (q, k, v)]
        want, want_lse = ref.attention_fwd_ref(*host, mask=mask)
        whole, whole_lse = nf.flash_attn_fwd(q, k, v, causal=causal, window_size=window)
        whole_err = np.abs(whole.float().cpu().numpy() - want).max()
        s = n // world
        shard = [torch.cat([t[:, g:g + c] for _, g, c in nfd.chunks(r, world, s, layout)], 1)
                 for t in (q, k, v) for r in range(world)]
        qs, ks, vs = shard[:world], shard[world:2 * world], shard[2 * world:]
        blocks = list(zip(ks, vs))
        right = 0 if causal else window[1]
        for r in range(world):
            out, lse = nfd.ring_forward(qs[r], ks[r], vs[r], d ** -0.5, window[0], right,
                                        _OneProcessRing(r, world, blocks), layout)
            rows = [g for _, g0, c in nfd.chunks(r, world, s, layout) for g in range(g0, g0 + c)]
            err = np.abs(out.float().cpu().numpy() - want[:, rows]).max()
            assert err <= 2 * whole_err + 1e-5, (causal, layout, r, err, whole_err)
            np.testing.assert_allclose(lse.cpu().numpy(), want_lse[:, :, rows], atol=2e-4)


def test_world_size_one_is_the_plain_call(rng):
    """One process, one rank: the ring is the unsplit call, forward and gradients (gloo on CPU
    tensors under the simulator, NCCL on a GPU)."""
    import numba_flash.torch as nft

    device = "cpu" if SIMULATOR else "cuda"
    backend = "gloo" if SIMULATOR else "nccl"
    shape, dtype = ((1, 6, 2, 8), torch.float32) if SIMULATOR else \
        ((2, 2048, 4, 64), torch.bfloat16)
    dist.init_process_group(backend, rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{_free_port()}")
    try:
        x = [torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
             .to(device=device, dtype=dtype) for _ in range(4)]
        grads = []
        for run in (lambda q, k, v: nfd.ring_flash_attn_func(q, k, v, causal=True),
                    lambda q, k, v: nft.flash_attn_func(q, k, v, causal=True)):
            q, k, v = (t.clone().requires_grad_() for t in x[:3])
            out = run(q, k, v)
            out.backward(x[3])
            grads.append([out.detach(), q.grad, k.grad, v.grad])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                                       rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    finally:
        dist.destroy_process_group()


def test_bad_shards_are_refused_before_anything_is_sent(rng):
    """A shard the kernels would refuse (here: k of another head dim) fails every check on its
    own rank before the first message, so no rank is left waiting in the ring."""
    device = "cpu" if SIMULATOR else "cuda"
    dist.init_process_group("gloo" if SIMULATOR else "nccl", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{_free_port()}")
    try:
        q = torch.zeros(1, 4, 2, 8, device=device)
        with pytest.raises(ValueError, match="k"):
            nfd.ring_flash_attn_func(q, torch.zeros(1, 4, 2, 16, device=device), q)
        with pytest.raises(ValueError, match="zigzag"):
            nfd.ring_flash_attn_func(q[:, :3], q[:, :3], q[:, :3])
        with pytest.raises((ValueError, TypeError), match="window_size"):
            nfd.ring_flash_attn_func(q, q, q, window_size=(-2, 0))
    finally:
        dist.destroy_process_group()
