"""Exchanges and orderings between threads that are not one instruction family's own: the warp
shuffle and the shared-memory proxy fence. (wgmma's fences are in ``wgmma``, cp.async's waits
in ``memory``.)

Shuffles. ``shfl.sync.bfly.b32`` lets the lanes of a warp swap registers without shared memory:
lane ``i`` receives the value of lane ``i ^ lane_mask``. The ``.sync`` form also makes the lanes
of its member mask (here the whole warp) converge before they exchange, which is why it lives
with the synchronization: the online softmax reduces the row maxima and sums of a group of four
lanes with masks 1 and 2. Numba has the instruction (``cuda.shfl_xor_sync``); the wrapper gives
it the signature of its emulation, whose simulator has no warp shuffles and exchanges through a
shared ``scratch`` array between two barriers of the caller's warp instead (so every thread of a
warp makes the call together, as the instruction requires; other warps may run other code).

Proxies. Ordinary stores and ``cp.async`` write shared memory through the *generic proxy*;
wgmma reads its operands through the *async proxy*, which does not see those writes in order
by itself. ``fence.proxy.async.shared::cta`` makes this thread's earlier shared-memory writes
visible to later async-proxy reads; the kernels wait for their copies, fence, then
``syncthreads`` so every thread's writes are covered before any warp issues a wgmma.

API:

    shfl_xor(value, lane_mask, scratch, tid)    the value of lane ``lane ^ lane_mask``
    scratch_size(threads)                       float32 elements of shfl_xor's scratch: 1 here
    proxy_fence()                               fence.proxy.async.shared::cta
"""

from numba import cuda, types
from numba.cuda.extending import intrinsic

from .codegen import void_asm


def scratch_size(threads):
    """Elements of the float32 scratch array ``shfl_xor`` takes: a single unused word on a GPU
    (shuffles need no memory; the emulation needs one per thread)."""
    return 1


@cuda.jit(device=True, inline="always")
def shfl_xor(value, lane_mask, scratch, tid):
    return cuda.shfl_xor_sync(0xFFFFFFFF, value, lane_mask)


@intrinsic
def proxy_fence(typingctx):
    """Make this thread's shared-memory writes visible to wgmma reads
    (``fence.proxy.async.shared::cta``)."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "fence.proxy.async.shared::cta;")
        return context.get_dummy_value()

    return types.void(), codegen
