"""The simulator's ``tma``: tensor-memory-accelerator box copies and mbarriers
(``kernels/ptx/tma.py`` has the instructions and the API).

A box copy completes at issue: the emulation reads the box straight from the array (the map is
not read), writes zeros for every element outside the array's sizes, stores the box in the
128-byte swizzle of ``ptx/layout.py`` and completes its bytes on the barrier. An mbarrier is one
uint64 word of shared memory holding its phase, expected arrivals, pending arrivals and pending
bytes; the simulator's threads are Python threads, so a lock orders their updates and ``wait``
yields until the phase flips.
"""

import threading
import time

import numpy as np
from numba import cuda

from ..ptx.layout import BLOCK_COLS

_lock = threading.Lock()
_FIELD = (1 << 20) - 1        # arrivals: bits 0-19 pending, 20-39 expected
_TX_SHIFT, _TX_MASK = 40, (1 << 23) - 1


def _fields(word):
    word = int(word)
    return (word >> 63, (word >> 20) & _FIELD, word & _FIELD, (word >> _TX_SHIFT) & _TX_MASK)


def _word(phase, count, pending, tx):
    return np.uint64((phase << 63) | (tx << _TX_SHIFT) | (count << 20) | pending)


def _update(bars, i, arrivals, tx):
    """Take ``arrivals`` and add ``tx`` bytes (negative: completed) under the lock; the phase
    completes when nothing is pending."""
    with _lock:
        phase, count, pending, left = _fields(bars[i])
        pending -= arrivals
        left += tx
        if pending < 0 or left < 0:
            raise RuntimeError(f"mbarrier {i}: more arrivals or bytes than the phase expects")
        if pending == 0 and left == 0:
            phase, pending = phase ^ 1, count
        bars[i] = _word(phase, count, pending, left)


@cuda.jit(device=True)
def mbarrier_init(bars, i, count):
    bars[i] = _word(0, int(count), int(count), 0)


@cuda.jit(device=True)
def mbarrier_init_fence():
    return None


@cuda.jit(device=True)
def expect_tx(bars, i, nbytes):
    _update(bars, i, 1, int(nbytes))


@cuda.jit(device=True)
def arrive(bars, i):
    _update(bars, i, 1, 0)


@cuda.jit(device=True)
def wait(bars, i, parity):
    while True:
        with _lock:
            if _fields(bars[i])[0] != int(parity):
                return
        time.sleep(0)


@cuda.jit(device=True)
def tensormap_acquire(tmap):
    return None


def _swizzled(rows):
    """Element order of a ``rows`` x 64 box in the 128-byte swizzle: ``flat[perm] = box``."""
    r = np.arange(rows)[:, None]
    c = np.arange(BLOCK_COLS)[None, :]
    return (r * BLOCK_COLS + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)).reshape(-1)


@cuda.jit(device=True)
def load_box_4d(smem, offset, tmap, gmem, coords, rows, bars, i):
    rows = int(rows)
    box = np.zeros((rows, BLOCK_COLS), smem.dtype)
    c0, c1, c2, c3 = (int(c) for c in coords)
    if 0 <= c3 < gmem.shape[0] and 0 <= c1 < gmem.shape[2]:
        r_lo, r_hi = max(c2, 0), min(c2 + rows, gmem.shape[1])
        k_lo, k_hi = max(c0, 0), min(c0 + BLOCK_COLS, gmem.shape[3])
        if r_lo < r_hi and k_lo < k_hi:
            box[r_lo - c2:r_hi - c2, k_lo - c0:k_hi - c0] = gmem[c3, r_lo:r_hi, c1, k_lo:k_hi]
    offset = int(offset)
    if offset * smem.itemsize % 1024:
        raise ValueError(f"TMA box with the 128-byte swizzle at shared byte "
                         f"{offset * smem.itemsize}: it must start on a 1024-byte boundary")
    flat = smem.reshape(-1)
    flat[offset + _swizzled(rows)] = box.reshape(-1)
    _update(bars, i, 0, -box.nbytes)
