"""runtime/simulator.py: the simulator's static shared arrays are created once per declaration
even when every thread of the block reaches the declaration at the same time, and device calls
into other modules see the launch through swaps held for its length."""

import time

import numpy as np
import pytest
from numba import cuda, float32

from numba_flash.runtime import device  # noqa: F401  (importing it installs the patch)
from helpers import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="a patch of Numba's CUDA simulator")

THREADS = 64


@cuda.jit
def _sum_of_slots(out):
    s = cuda.shared.array(THREADS, float32)
    t = cuda.shared.array(THREADS, float32)  # another line: another array
    s[cuda.threadIdx.x] = cuda.threadIdx.x
    t[cuda.threadIdx.x] = 1.0
    cuda.syncthreads()
    acc = 0.0
    for i in range(THREADS):
        acc += s[i] * t[i]
    out[cuda.threadIdx.x] = acc


def test_every_thread_sees_one_array_per_declaration(monkeypatch):
    # A slow allocation holds each creating thread between its lookup and its store, where an
    # unlocked lookup lets the other threads in to create arrays of their own.
    from numba.cuda.simulator import kernelapi

    assert getattr(kernelapi.FakeCUDAShared.array, "locked", False)
    empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.002)
        return empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", slow_empty)
    out = np.zeros(THREADS, np.float32)
    _sum_of_slots[1, THREADS](out)
    monkeypatch.undo()
    np.testing.assert_array_equal(out, np.full(THREADS, THREADS * (THREADS - 1) / 2))


def test_device_calls_into_another_module_see_the_launch_and_leave_it_restored():
    """A device function of another module reads the launch's thread index through that
    module's ``cuda`` global, which the launch swaps once (``hold_module_swaps``) and restores
    at its end, also when the kernel raises."""
    import types

    from numba.cuda.simulator import kernel
    from numba_flash.runtime import simulator

    assert getattr(kernel.FakeCUDAKernel.__call__, "holds_swaps", False)
    other = types.ModuleType("other_module")
    exec("from numba import cuda\n"
         "@cuda.jit(device=True)\n"
         "def lane_times(k):\n"
         "    return cuda.threadIdx.x * k\n", other.__dict__)

    @cuda.jit
    def fill(out, k):
        out[cuda.threadIdx.x] = other.lane_times(k)

    for k in (2, 3):  # a second launch swaps again
        out = np.zeros(THREADS, np.int64)
        fill[1, THREADS](out, k)
        np.testing.assert_array_equal(out, k * np.arange(THREADS))
        assert other.cuda is cuda and not simulator._held
    with pytest.raises(IndexError):
        fill[1, THREADS + 1](np.zeros(THREADS, np.int64), 1)
    assert other.cuda is cuda and not simulator._held
