"""Tile configurations, grids, compiled-kernel cache and the large-shared-memory opt-in.

Kernel modules export *factories*: plain Python functions closed over compile-time constants
(tile sizes, head dim, causal, storage format). This module turns a factory's output into a
compiled kernel once per configuration, with an explicit signature so that launches skip Numba's
type inference, and raises the kernel's dynamic shared-memory limit when it needs more than the
48 KiB every kernel gets by default (Hopper allows up to 227 KiB per block).
"""

from dataclasses import dataclass
from functools import lru_cache

from numba import config, cuda, types

from .kernels import primitives as prim

SIMULATOR = bool(config.ENABLE_CUDASIM)
DEFAULT_SHARED_LIMIT = 48 * 1024


@dataclass(frozen=True)
class Tiles:
    """One kernel configuration: tile sizes, threads per block and dynamic shared bytes."""

    BLOCK_M: int
    BLOCK_N: int
    threads: int
    shared_bytes: int


# ----------------------------------------------------------------------------- SIMT forward

# (BLOCK_M, BLOCK_N) by head dim, measured on an H200 (bench/results). Larger head dims trade
# BLOCK_N (shared memory, S registers) for the O_i micro-tile, which grows as HEAD_DIM / 8.
_SIMT_FWD_TILES = ((64, (64, 64)), (128, (64, 32)), (256, (32, 32)))


def simt_forward_tiles(head_dim):
    from .kernels.simt import forward

    bm, bn = next(t for limit, t in _SIMT_FWD_TILES if head_dim <= limit)
    words = forward.shared_layout(bm, bn, head_dim)["words"]
    return Tiles(bm, bn, forward.THREADS, 4 * words)


def attention_signature(fmt):
    """Signature shared by the forward kernels: q, k, v, out, lse, Sq, Sk, Hq, group, scale."""
    t = types.Array(prim.storage_type(fmt), 4, "A")
    return types.void(t, t, t, t, types.Array(types.float32, 3, "A"),
                      types.int32, types.int32, types.int32, types.int32, types.float32)


@lru_cache(maxsize=None)
def simt_forward_kernel(head_dim, causal, fmt):
    from .kernels.simt import forward

    tiles = simt_forward_tiles(head_dim)
    pyfunc = forward.make_forward_kernel(head_dim, tiles.BLOCK_M, tiles.BLOCK_N, causal, fmt)
    return compile_kernel(pyfunc, attention_signature(fmt), tiles.shared_bytes), tiles


# ----------------------------------------------------------------------------- compile & launch

def compile_kernel(pyfunc, signature, shared_bytes):
    """Compile ``pyfunc`` for ``signature`` (fast math: ``exp2`` becomes ``ex2.approx``) and let
    it use ``shared_bytes`` of dynamic shared memory. Under the simulator: a simulated kernel."""
    if SIMULATOR:
        return cuda.jit(pyfunc)
    kernel = cuda.jit(signature, fastmath=True)(pyfunc)
    if shared_bytes > DEFAULT_SHARED_LIMIT:
        _opt_in_shared(kernel, shared_bytes)
    return kernel


def _opt_in_shared(kernel, nbytes):
    """Raise the dynamic shared-memory limit of every compiled overload of ``kernel``.

    numba-cuda has no public API for this attribute; it is set on the driver's kernel handle.
    """
    from numba.cuda.cudadrv.driver import binding, driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    for overload in kernel.overloads.values():
        cufunc = overload._codelibrary.get_cufunc()
        driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)


def cdiv(a, b):
    return -(-a // b)


def launch(kernel, grid, threads, stream, shared_bytes, *args):
    """Launch on ``stream``; the simulator ignores streams."""
    if SIMULATOR:
        kernel[grid, threads, 0, shared_bytes](*args)
    else:
        kernel[grid, threads, stream, shared_bytes](*args)
