"""The simulator's ``sync``: the warp shuffle and the proxy fence (``kernels/ptx/sync.py`` has
the instructions and the API), and ``warp_sync``, the barrier every emulated warp-collective
instruction exchanges its operands behind.

The simulator runs each CUDA thread as a Python thread and has no warp shuffles: ``shfl_xor``
publishes each thread's value in a shared float32 ``scratch`` array between two ``warp_sync``
and reads its partner's. Only the 32 threads of the caller's warp wait for each other, as on a
GPU: every thread of a warp makes the call together (the instruction's ``.sync`` contract),
while another warp may be elsewhere in the kernel, in a branch of its own or at a barrier.
``tid ^ lane_mask`` stays in the warp for masks below 32. The simulator has one memory model,
so the proxy fence has nothing to order.
"""

import threading

import numpy as np
from numba import cuda

WARP = 32
WARP_WAIT_S = 300  # a warp whose threads do not all arrive is a kernel bug: fail, do not hang
_lock = threading.Lock()


def warp_sync(tid):
    """Wait until the threads of thread ``tid``'s warp (32, or the rest of a partial last warp)
    have all called this: the simulator's ``__syncwarp()``. The barriers live on the
    simulator's block manager, one per (block, warp), and go with it when the launch ends. A
    warp that does not all arrive within ``WARP_WAIT_S`` seconds raises ``RuntimeError``."""
    me = threading.current_thread()
    manager = me._manager
    warp = tid // WARP
    with _lock:
        barriers = manager.__dict__.setdefault("numba_flash_warps", {})
        key = (tuple(me.blockIdx), warp)
        barrier = barriers.get(key)
        if barrier is None:
            threads = int(np.prod(tuple(manager._block_dim)))
            barrier = barriers[key] = threading.Barrier(min(WARP, threads - WARP * warp))
    try:
        barrier.wait(WARP_WAIT_S)
    except threading.BrokenBarrierError:
        raise RuntimeError(f"warp {warp} of block {tuple(me.blockIdx)}: not every thread of the "
                           f"warp reached the same warp-collective call") from None


def scratch_size(threads):
    """Elements of the float32 scratch array ``shfl_xor`` needs: one per thread."""
    return threads


@cuda.jit(device=True)
def shfl_xor(value, lane_mask, scratch, tid):
    warp_sync(tid)  # the warp has read the previous exchange
    scratch[tid] = value
    warp_sync(tid)
    other = scratch[tid ^ lane_mask]
    return other


@cuda.jit(device=True)
def proxy_fence():
    """fence.proxy.async.shared::cta (one memory model under the simulator)."""
    return None
