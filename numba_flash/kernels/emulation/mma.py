"""The simulator's ``mma``: mma.sync m16n8k16 and ldmatrix (``kernels/ptx/mma.py`` has the
instructions, their fragment layouts and the API), as exchanges between the simulated threads.

A warp-collective instruction takes its operands from all 32 lanes, so each emulation runs in
three steps: a warp barrier (``sync.warp_sync``: every lane has finished reading the scratch of
the previous call), publish this thread's registers (or row address) in ``scratch[SCRATCH_WORDS
* tid ...]``, a warp barrier, then compute this lane's result from its warp's 32 entries with
the NumPy model of ``kernels/ptx/model.py``. Hence the callers' contract, the instructions'
own: every thread of a warp calls together (other warps may be elsewhere), the block is a whole
number of warps, ``tid`` is the thread's linear index and ``scratch`` holds
``scratch_size(threads)`` uint32 words.
"""

import numpy as np
from numba import cuda

from ..ptx.layout import SCRATCH_DTYPE, SCRATCH_WORDS  # noqa: F401  (API)
from ..ptx.layout import ldmatrix_a_rowcol, ldmatrix_b_rowcol  # noqa: F401  (API)
from ..ptx.model import lane_ldmatrix, lane_mma, warp_tiles
from .sync import warp_sync


def scratch_size(threads):
    """Elements of the ``uint32`` scratch array the warp-collective calls need for a block of
    ``threads`` threads: ``6 * threads``."""
    return SCRATCH_WORDS * threads


def _make_mma(fmt):
    @cuda.jit(device=True)
    def mma(a, b, c, scratch, tid):
        warp_sync(tid)
        row = SCRATCH_WORDS * tid
        for i in range(4):
            scratch[row + i] = np.uint32(int(a[i]) & 0xFFFFFFFF)
        scratch[row + 4] = np.uint32(int(b[0]) & 0xFFFFFFFF)
        scratch[row + 5] = np.uint32(int(b[1]) & 0xFFFFFFFF)
        warp_sync(tid)
        lane = tid & 31
        base = tid - lane
        words = np.array(scratch[SCRATCH_WORDS * base:SCRATCH_WORDS * (base + 32)],
                         dtype=np.uint32).reshape(32, SCRATCH_WORDS)
        A, B = warp_tiles(words[:, :4], words[:, 4:], fmt)
        return lane_mma(A, B, c, lane)

    return mma


def _make_ldmatrix(num, trans):
    @cuda.jit(device=True)
    def ldmatrix(smem, offset, scratch, tid):
        warp_sync(tid)
        scratch[SCRATCH_WORDS * tid] = np.uint32(offset)
        warp_sync(tid)
        lane = tid & 31
        base = tid - lane
        offsets = scratch[SCRATCH_WORDS * base:SCRATCH_WORDS * (base + 32):SCRATCH_WORDS]
        return lane_ldmatrix(smem.reshape(-1), offsets, lane, num, trans)

    return ldmatrix


mma_f16 = _make_mma("float16")
mma_bf16 = _make_mma("bfloat16")
ldmatrix_x4 = _make_ldmatrix(4, False)
ldmatrix_x4_trans = _make_ldmatrix(4, True)
ldmatrix_x2 = _make_ldmatrix(2, False)
ldmatrix_x2_trans = _make_ldmatrix(2, True)


def mma(fmt):
    """The mma device function for storage format ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": mma_f16, "bfloat16": mma_bf16}[fmt]
