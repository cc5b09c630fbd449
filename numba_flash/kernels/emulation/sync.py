"""The simulator's ``sync``: the warp shuffle and vote, and the proxy fence
(``kernels/ptx/sync.py`` has the instructions and the API), and ``warp_sync``, the barrier every
emulated warp-collective instruction exchanges its operands behind.

The simulator runs each CUDA thread as a Python thread and has no warp shuffles: ``shfl_xor``
publishes each thread's value in a shared float32 ``scratch`` array between two ``warp_sync``
and reads its partner's (``warp_any``: those of its whole warp). Only the 32 threads of the
caller's warp wait for each other, as on a GPU: every thread of a warp makes the call together
(the instruction's ``.sync`` contract), while another warp may be elsewhere in the kernel, in a
branch of its own or at a barrier. ``tid ^ lane_mask`` stays in the warp for masks below 32.
The simulator has one memory model, so the proxy fence has nothing to order.

Named barriers (``named_sync``, ``named_arrive``) are a ``threading.Condition`` per (block,
barrier id) with an arrival count and a generation: the ``count``-th arrival starts the next
generation and wakes the waiters; ``named_arrive`` only counts.

The grid dependency controls have nothing to do: the simulator runs one launch after another.
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


def syncwarp(tid):
    """bar.warp.sync: ``warp_sync``."""
    warp_sync(tid)


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
def warp_any(pred, scratch, tid):
    """Whether ``pred`` holds in any thread of the caller's warp: each publishes it in
    ``scratch`` between two ``warp_sync``, as ``shfl_xor`` does, and reads its warp's."""
    warp_sync(tid)
    scratch[tid] = 1.0 if pred else 0.0
    warp_sync(tid)
    first = tid - tid % WARP
    found = False
    for i in range(first, min(first + WARP, scratch.shape[0])):
        found = found or scratch[i] != 0.0
    return found


def warp_uniform(value):
    """Lane 0's value: the caller passes one that every lane of its warp holds."""
    return value


@cuda.jit(device=True)
def proxy_fence():
    """fence.proxy.async.shared::cta (one memory model under the simulator)."""
    return None


def _named_barrier(tid, barrier, count, wait):
    me = threading.current_thread()
    with _lock:
        barriers = me._manager.__dict__.setdefault("numba_flash_named", {})
        state = barriers.setdefault((tuple(me.blockIdx), int(barrier)),
                                    {"cond": threading.Condition(), "arrived": 0, "gen": 0})
    with state["cond"]:
        gen = state["gen"]
        state["arrived"] += 1
        if state["arrived"] == count:
            state["arrived"] = 0
            state["gen"] += 1
            state["cond"].notify_all()
        elif wait and not state["cond"].wait_for(lambda: state["gen"] != gen, WARP_WAIT_S):
            raise RuntimeError(f"named barrier {barrier} of block {tuple(me.blockIdx)}: fewer "
                               f"than {count} threads arrived")


def named_sync(barrier, count, tid):
    """bar.sync barrier, count: arrive and wait for the generation to complete."""
    _named_barrier(tid, barrier, count, True)


def named_arrive(barrier, count, tid):
    """bar.arrive barrier, count: arrive without waiting."""
    _named_barrier(tid, barrier, count, False)


def launch_dependents():
    """griddepcontrol.launch_dependents: the simulator's launches never overlap."""
    return None


def wait_prior_grid():
    """griddepcontrol.wait: the kernel before this one has finished already."""
    return None


def regs_increase(n):
    """setmaxnreg.inc: the simulator has no register file to divide."""
    return None


def regs_decrease(n):
    """setmaxnreg.dec: the simulator has no register file to divide."""
    return None
