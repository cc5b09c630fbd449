"""What the project changes in Numba's CUDA simulator to run its kernels faithfully.

The simulator runs every CUDA thread of a block as a Python thread. A static shared array is
created by the first thread that reaches its declaration and then found by the others under the
declaration's (file, line). In numba-cuda 0.30 (``simulator/kernelapi.FakeCUDAShared.array``)
the lookup and the creation are not under a lock: two threads that reach the declaration
together may each create an array, and the one that loses keeps writing to an array no other
thread reads. The kernel then computes wrong results now and then, more often on a busy
machine. ``lock_shared_arrays`` replaces the method with the same one under a lock (and takes
the caller's frame directly instead of formatting the whole stack, which also makes every
declaration cheaper).
"""

import sys
import threading

_lock = threading.Lock()


def lock_shared_arrays():
    """Make the simulator's static shared-array declarations thread-safe (idempotent)."""
    import numpy as np
    from numba.cuda.simulator import kernelapi

    types, numpy_support = kernelapi.types, kernelapi.numpy_support  # the simulator's own

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "locked", False):
        return

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:  # dynamic shared memory: one buffer, viewed as the dtype asks
            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with _lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    array.locked = True
    shared.array = array
