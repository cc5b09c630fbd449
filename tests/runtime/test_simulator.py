"""runtime/simulator.py: the simulator's static shared arrays are created once per declaration
even when every thread of the block reaches the declaration at the same time."""

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
