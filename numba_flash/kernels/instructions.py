"""The one place the kernels' instructions are bound: the inline-PTX intrinsics of
``kernels/ptx`` on a GPU, or their plain-Python emulations in ``kernels/emulation`` under Numba's
CUDA simulator (which cannot run PTX). The choice is made once, when this module is imported,
from ``numba.config.ENABLE_CUDASIM`` (``runtime.device.SIMULATOR``).

Both packages have the same modules with the same functions and signatures, so a kernel reads
the same either way::

    from ..instructions import convert, memory, sync
    memory.cp_async_16_zfill(smem, offset, q, (b, row, h, col), row < seqlen)

    mma         mma.sync m16n8k16, ldmatrix (x2/x4, .trans), fragment rows, scratch size
    wgmma       wgmma.mma_async (ss/rs), its fences, commit and wait, descriptors, swizzle
    memory      cp.async (16-byte, zfill), commit/wait groups, shared and global addresses,
                16-byte global stores, SHARED_ALIGN
    sync        shfl_xor, its scratch size, fence.proxy.async, named barriers,
                griddepcontrol (launch_dependents, wait)
    tma         TMA box copies (cp.async.bulk.tensor) and the mbarriers they complete
    convert     16-bit <-> float32, pack/unpack of f16x2/bf16x2, exp2_approx, div_u32
"""

from ..runtime.device import SIMULATOR

if SIMULATOR:
    from .emulation import convert, memory, mma, sync, tma, wgmma
else:
    from .ptx import convert, memory, mma, sync, tma, wgmma

__all__ = ["convert", "memory", "mma", "sync", "tma", "wgmma"]
