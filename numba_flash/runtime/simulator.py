"""What the project changes in Numba's CUDA simulator to run its kernels faithfully.

The simulator runs every CUDA thread of a block as a Python thread. A static shared array is
created by the first thread that reaches its declaration and then found by the others under the
declaration's (file, line). In numba-cuda 0.30 (``simulator/kernelapi.FakeCUDAShared.array``)
the lookup and the creation are not under a lock: two threads that reach the declaration
together may each create an array, and the one that loses keeps writing to an array no other
thread reads. The kernel then computes wrong results now and then, more often on a busy
machine. ``lock_shared_arrays`` replaces the method with the same one under a lock (and takes
the caller's frame directly instead of formatting the whole stack, which also makes every
declaration cheaper). ``hold_module_swaps`` takes the simulator's per-call swap of a module's
``cuda`` global, and its locks, off every device-function call.
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


_swaps_lock = threading.Lock()
_held = {}  # id(a module's globals) -> the swap of its ``cuda`` held by the running launch


def hold_module_swaps():
    """Let device-function calls skip the simulator's per-call swap of the ``cuda`` global
    (idempotent).

    numba-cuda 0.30 (``simulator/kernel.FakeCUDAKernel.__call__``) runs every device-function
    call inside ``kernelapi.swapped_cuda_module``, which points the function's module-level
    ``cuda`` at the launch's fake module and back, taking two locks on the way in and one on the
    way out. Every simulated thread does that on every call: in a simulated seesaw decode, a
    third of the samples sit in those locks. Here the first call into a module during a launch
    makes the same swap once and holds it to the end of the launch (launches never overlap: the
    simulator keeps one launch's state in globals, and ``launcher.launch`` serializes them);
    later calls into that module go straight to the function.

    Caveat: while a launch holds a module's swap, that module's ``cuda`` is the fake one for
    every host thread, so another thread that builds kernels in it then (the ``make_*``
    factories call ``cuda.jit``) would see the fake module. numba-cuda already swaps a kernel's
    own module for a whole launch, so this is not new in kind; nothing here builds and launches
    from two threads at once."""
    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.kernelapi import swapped_cuda_module

    original = kernel.FakeCUDAKernel.__call__
    if getattr(original, "holds_swaps", False):
        return

    def call(self, *args):
        context = kernel._get_kernel_context()
        if not (self._device or context):  # a launch: undo its swaps when it is over
            try:
                return original(self, *args)
            finally:
                with _swaps_lock:
                    for swap in _held.values():
                        swap.__exit__(None, None, None)
                    _held.clear()
        if context is None:  # a device function called outside any launch: as numba-cuda does
            return original(self, *args)
        key = id(self.fn.__globals__)
        if key not in _held:
            with _swaps_lock:
                if key not in _held:
                    swap = swapped_cuda_module(self.fn, context)
                    swap.__enter__()
                    _held[key] = swap
        return self.fn(*args)

    call.holds_swaps = True
    kernel.FakeCUDAKernel.__call__ = call
