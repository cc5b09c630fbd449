"""The simulator's ``wgmma``: warpgroup MMA, its descriptors and fences (``kernels/ptx/wgmma.py``
has the instructions, the 128-byte swizzle and the API).

``mma_ss`` reads both operands from the simulated shared memory through the descriptors, with
the swizzle applied as the hardware applies it (``kernels/ptx/model.py``'s ``read_operand``; the
emulated "address" is the byte offset in the shared array, so a tile is aligned when its offset
is). ``mma_rs`` first exchanges the warp's A registers through ``scratch`` between two warp
barriers (``mma``'s convention: every thread of a warp calls together, ``tid`` is the linear
thread index; another warpgroup may run other code meanwhile). The asynchronous instructions
compute at issue; the fences and waits do nothing.
"""

import numpy as np
from numba import cuda, uint64

from . import memory
from ..ptx.layout import (BLOCK_COLS, SCRATCH_WORDS, SWIZZLE_BYTES, TILE_ALIGN,  # noqa: F401
                          make_aligned_base, make_descriptor, make_descriptor_low,
                          HIGH_WORD, padded_cols, tile_offset, SBO, MN_K_STEP, k_step,
                          WARPGROUP, E4M3, K_STEP_ELEMS)
from ..ptx.model import read_operand, warp_a_tile
from .sync import warp_sync


def scratch_size(threads):
    """uint32 words of the scratch array ``mma_rs`` exchanges A through: ``6 * threads``."""
    return SCRATCH_WORDS * threads


aligned_base = make_aligned_base(memory.shared_address)
descriptor = make_descriptor(memory.shared_address)
descriptor_low = make_descriptor_low(memory.shared_address)


@cuda.jit(device=True, inline="always")
def operand_low(smem, offset, lbo):
    """``wgmma.operand_low``: ``descriptor_low`` of ``aligned_base(smem) + offset``."""
    return descriptor_low(smem, aligned_base(smem) + offset, lbo)


@cuda.jit(device=True, inline="always")
def descriptor_join(low):
    """``wgmma.descriptor_join``: the low word's 32 bits under the constant high word."""
    return (uint64(low) & uint64(0xFFFFFFFF)) | (uint64(HIGH_WORD) << uint64(32))


def _make_mma(fmt, n, a_regs, trans_b):
    @cuda.jit(device=True)
    def mma(acc, start, a, desc_b, scale_d, smem, scratch, tid):
        flat = smem.reshape(-1)
        lane = tid & 31
        slab = (tid >> 5) & 3  # the warp's 16 rows of the warpgroup's 64
        if a_regs:
            warp_sync(tid)
            for i in range(4):
                scratch[SCRATCH_WORDS * tid + i] = np.uint32(int(a[i]) & 0xFFFFFFFF)
            warp_sync(tid)
            base = tid - lane
            words = np.array(scratch[SCRATCH_WORDS * base:SCRATCH_WORDS * (base + 32)],
                             dtype=np.uint32).reshape(32, SCRATCH_WORDS)[:, :4]
            A = warp_a_tile(words, fmt)
        else:
            A = read_operand(flat, a, 64, fmt, False)[16 * slab:16 * slab + 16]
        B = read_operand(flat, desc_b, n, fmt, trans_b == 1)
        if not trans_b:
            B = B.T
        D = A @ B  # products of 16-bit (or 8-bit) values are exact; one rounding to float32
        out = acc.reshape(-1)
        g, t = lane >> 2, lane & 3
        for i in range(n // 8):
            for e in range(4):
                value = D[g + 8 * (e >> 1), 8 * i + 2 * t + (e & 1)]
                if scale_d:
                    value += np.float64(out[start + 4 * i + e])
                out[start + 4 * i + e] = np.float32(value)

    return mma


_MMA = {}


def mma_ss(fmt, n, trans_b):
    """``D[64 x n] (+)= A B`` with A (K-major, 64 rows) and B from shared memory descriptors;
    ``trans_b`` 0: B stored K-major ([n][k] rows), 1: MN-major ([k][n] rows)."""
    key = (fmt, n, False, trans_b)
    if key not in _MMA:
        _MMA[key] = _make_mma(fmt, n, False, trans_b)
    return _MMA[key]


def mma_rs(fmt, n, trans_b):
    """As ``mma_ss`` with A from registers: 4 uint32 per thread, mma.py's A-fragment layout for
    the warp's 16 rows."""
    key = (fmt, n, True, trans_b)
    if key not in _MMA:
        _MMA[key] = _make_mma(fmt, n, True, trans_b)
    return _MMA[key]


@cuda.jit(device=True)
def fence():
    """wgmma.fence (nothing to order under the simulator)."""
    return None


@cuda.jit(device=True)
def commit():
    """wgmma.commit_group (emulated wgmma completes at issue)."""
    return None


@cuda.jit(device=True)
def wait(n):
    """wgmma.wait_group n (emulated wgmma completes at issue)."""
    return None


@cuda.jit(device=True)
def fence_operands(acc, count):
    """Compiler-level fence on accumulator registers (nothing to do here)."""
    return None
