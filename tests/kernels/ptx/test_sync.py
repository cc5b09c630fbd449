"""The warp shuffle of kernels/ptx/sync.py (and its emulation's warp barrier): lanes swap values
with ``lane ^ mask``, and a warp's exchange waits for its own 32 threads only, so warps may run
different code between the block's barriers, as on a GPU; and the named barriers, with which
two groups of warps hand data to each other while a third never waits; and the warp vote.
Simulator or GPU."""

import functools

import numpy as np
import pytest
from numba import cuda, float32, int32

from numba_flash.kernels.instructions import sync

THREADS = 96  # three warps
SCRATCH = sync.scratch_size(THREADS)


@functools.lru_cache(maxsize=None)
def _swap_kernel():
    shfl_xor = sync.shfl_xor

    @cuda.jit
    def swap(masks, out):
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        for i in range(masks.shape[0]):
            out[i, tid] = shfl_xor(float32(tid), masks[i], scratch, tid)

    return swap


@functools.lru_cache(maxsize=None)
def _divergent_kernel():
    shfl_xor = sync.shfl_xor

    @cuda.jit
    def divergent(out):
        """Warp 0 shuffles twice and publishes the results, warp 1 shuffles once, warp 2 only
        waits at the block barrier: every thread then reads what warp 0 published."""
        scratch = cuda.shared.array(SCRATCH, float32)
        published = cuda.shared.array(32, float32)
        tid = cuda.threadIdx.x
        v = float32(tid)
        if tid < 32:
            v = shfl_xor(v, 1, scratch, tid)
            v = shfl_xor(v, 2, scratch, tid)  # lane ^ 3
            published[tid] = v
        elif tid < 64:
            v = shfl_xor(v, 4, scratch, tid)  # lane ^ 4
        cuda.syncthreads()
        out[0, tid] = v
        out[1, tid] = published[tid & 31]

    return divergent


def test_shfl_xor_returns_the_value_of_lane_xor_mask():
    masks = np.array([1, 2, 4, 8, 16, 3, 31], np.int32)
    out = np.full((masks.size, THREADS), np.nan, np.float32)
    d_out = cuda.to_device(out)
    _swap_kernel()[1, THREADS](cuda.to_device(masks), d_out)
    tid = np.arange(THREADS)
    np.testing.assert_array_equal(d_out.copy_to_host(), (tid[None, :] ^ masks[:, None]))


@pytest.mark.parametrize("repeat", range(3))
def test_a_warps_shuffles_wait_for_that_warp_only(repeat):
    """With a block-wide barrier inside the shuffle, warp 0's first exchange would release warp 2
    from its ``syncthreads`` before warp 0 published (it read NaN or stale values)."""
    out = cuda.to_device(np.full((2, THREADS), np.nan, np.float32))
    _divergent_kernel()[1, THREADS](out)
    out = out.copy_to_host()
    tid = np.arange(THREADS)
    lane = tid & 31
    np.testing.assert_array_equal(out[0], np.where(tid < 32, tid ^ 3, np.where(tid < 64, tid ^ 4,
                                                                                tid)))
    np.testing.assert_array_equal(out[1], lane ^ 3)


ROUNDS = 5


@functools.lru_cache(maxsize=None)
def _handoff_kernel():
    named_sync, named_arrive = sync.named_sync, sync.named_arrive

    @cuda.jit
    def handoff(out):
        """Warp 0 writes round r's values and arrives on barrier 1; warp 1 syncs on it, reads
        them, writes its own and arrives on barrier 2, which warp 0 syncs on before the next
        round overwrites its slot. Warp 2 never touches a named barrier."""
        ping = cuda.shared.array(32, int32)
        pong = cuda.shared.array(32, int32)
        tid = cuda.threadIdx.x
        lane = tid & 31
        for r in range(ROUNDS):
            if tid < 32:
                ping[lane] = 100 * r + lane
                named_arrive(1, 64, tid)
                named_sync(2, 64, tid)
                out[r, tid] = pong[lane]
            elif tid < 64:
                named_sync(1, 64, tid)
                v = ping[lane]
                pong[lane] = -v
                out[r, tid] = v
                named_arrive(2, 64, tid)
            else:
                out[r, tid] = r

    return handoff


@pytest.mark.parametrize("repeat", range(2))
def test_named_barriers_hand_data_between_warps(repeat):
    out = cuda.to_device(np.full((ROUNDS, THREADS), -1, np.int32))
    _handoff_kernel()[1, THREADS](out)
    out = out.copy_to_host()
    r = np.arange(ROUNDS)[:, None]
    lane = np.arange(32)[None, :]
    np.testing.assert_array_equal(out[:, 32:64], 100 * r + lane)
    np.testing.assert_array_equal(out[:, :32], -(100 * r + lane))
    np.testing.assert_array_equal(out[:, 64:], np.broadcast_to(r, (ROUNDS, 32)))


@functools.lru_cache(maxsize=None)
def _vote_kernel():
    warp_any = sync.warp_any

    @cuda.jit
    def vote(lanes, out):
        """Thread ``tid`` votes true when it is ``lanes[warp]`` of its warp (-1: none)."""
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        out[tid] = 1 if warp_any(tid & 31 == lanes[tid >> 5], scratch, tid) else 0

    return vote


def test_warp_any_is_true_in_every_lane_of_a_warp_with_one_true_lane():
    lanes = np.array([-1, 31, 0], np.int32)  # warp 0: no lane; warp 1: its last; warp 2: its first
    out = cuda.to_device(np.full(THREADS, -1, np.int32))
    _vote_kernel()[1, THREADS](cuda.to_device(lanes), out)
    np.testing.assert_array_equal(out.copy_to_host(), np.repeat([0, 1, 1], 32))


def test_register_split_runs_and_needs_a_whole_program_compile():
    """setmaxnreg: the block computes the same with its warpgroups' registers moved (a no-op
    under the simulator); compiled for sm_90a as a whole program (``lto``), ptxas honours it
    at the launch cap of 168, while a relocatable compile ignores it (C7504), which is why the
    warp-specialized kernels compile with ``lto``."""
    import pathlib

    from helpers import SIMULATOR, to_device, to_host
    from kernels.ptx import _ptx_kernels as K
    from numba_flash.runtime import ptxcheck

    kernel = cuda.jit(K.register_split(False)[0])
    if SIMULATOR or cuda.get_current_device().compute_capability == (9, 0):
        x = np.random.default_rng(3).standard_normal((384, 64)).astype(np.float32)
        out = to_device(np.full(384, np.nan, np.float32))
        kernel[1, 384](to_device(x), out)
        got = to_host(out)
        acc = x.astype(np.float64)
        for _ in range(4):
            for i in range(64):  # in place, as the kernel updates its registers
                acc[:, i] = acc[:, i] * 0.5 + acc[:, (i + 1) % 64]
        np.testing.assert_allclose(got[128:], acc.sum(axis=1)[128:], rtol=1e-4, atol=1e-4)
        assert (got[:128] == 0).all()
    probe = str(pathlib.Path(K.__file__).resolve()) + ":probe"
    (ptx, whole), (_, relocatable) = ptxcheck.compile_reports_isolated(
        [(probe, (9, 0, "a"), ("register_split_lto",)), (probe, (9, 0, "a"), ("register_split",))])
    assert "setmaxnreg.inc.sync.aligned.u32 240" in ptx
    assert whole["registers"] == 168 and "C7504" not in whole["log"]
    assert whole["spill_stores"] == 0
    assert "C7504" in relocatable["log"]
