"""The simulator's ``sync``: the warp shuffle and the proxy fence (``kernels/ptx/sync.py`` has
the instructions and the API).

The simulator has no warp shuffles: ``shfl_xor`` publishes each thread's value in a shared
float32 ``scratch`` array between two ``syncthreads`` and reads its partner's. Every thread of
the block must make the call together, which the kernels guarantee by calling it outside any
thread-dependent branch; ``tid ^ lane_mask`` stays in the warp for masks below 32. The simulator
has one memory model, so the proxy fence has nothing to order.
"""

from numba import cuda


def scratch_size(threads):
    """Elements of the float32 scratch array ``shfl_xor`` needs: one per thread."""
    return threads


@cuda.jit(device=True)
def shfl_xor(value, lane_mask, scratch, tid):
    cuda.syncthreads()
    scratch[tid] = value
    cuda.syncthreads()
    other = scratch[tid ^ lane_mask]
    return other


@cuda.jit(device=True)
def proxy_fence():
    """fence.proxy.async.shared::cta (one memory model under the simulator)."""
    return None
