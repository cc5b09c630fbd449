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


# ----------------------------------------------------------------------------- SIMT backward

# By head dim: (BLOCK_M, BLOCK_N) of the dK/dV kernel (BLOCK_N keys held, BLOCK_M queries
# streamed) and of the dQ kernel (BLOCK_M queries held, BLOCK_N keys streamed). The register
# accumulators grow as HEAD_DIM / 8 per owned row, so larger head dims own fewer rows.
_SIMT_BWD_TILES = ((64, (32, 64), (64, 32)), (128, (32, 32), (64, 32)), (256, (32, 16), (32, 32)))
SIMT_BACKWARD_KERNELS = ("preprocess", "dkdv", "dq")


def simt_backward_tiles(head_dim, kernel):
    """Tiles of one backward kernel (``preprocess``: BLOCK_M rows of D per block, no tiles)."""
    from .kernels.simt import backward

    if kernel == "preprocess":
        return Tiles(backward.ROW_GROUPS, 0, backward.THREADS, 0)
    _, dkdv, dq = next(t for t in _SIMT_BWD_TILES if head_dim <= t[0])
    bm, bn = dkdv if kernel == "dkdv" else dq
    layout = backward.dkdv_shared_layout if kernel == "dkdv" else backward.dq_shared_layout
    return Tiles(bm, bn, backward.THREADS, 4 * layout(bm, bn, head_dim)["words"])


def simt_backward_spec(kernel, head_dim, causal, fmt):
    """``(pyfunc, signature, compile options)`` of one backward kernel, the form
    ``ptxcheck.compile_report_isolated`` takes. Signatures: preprocess (out, dout, delta, Sq,
    Hq); dkdv (q, k, v, dout, lse, delta, dk, dv, Sq, Sk, Hk, group, scale, scale_log2); dq
    (q, k, v, dout, lse, delta, dq, Sq, Sk, Hq, group, scale, scale_log2)."""
    from .kernels.simt import backward

    t = types.Array(prim.storage_type(fmt), 4, "A")
    f3 = types.Array(types.float32, 3, "A")
    i32, f32 = types.int32, types.float32
    if kernel == "preprocess":
        return (backward.make_preprocess_kernel(head_dim, fmt),
                types.void(t, t, f3, i32, i32), COMPILE_OPTIONS)
    tiles = simt_backward_tiles(head_dim, kernel)
    make = backward.make_dkdv_kernel if kernel == "dkdv" else backward.make_dq_kernel
    grads = (t, t) if kernel == "dkdv" else (t,)
    return (make(head_dim, tiles.BLOCK_M, tiles.BLOCK_N, causal, fmt),
            types.void(t, t, t, t, f3, f3, *grads, i32, i32, i32, i32, f32, f32), COMPILE_OPTIONS)


@lru_cache(maxsize=None)
def simt_backward_kernel(kernel, head_dim, causal, fmt):
    pyfunc, signature, _ = simt_backward_spec(kernel, head_dim, causal, fmt)
    tiles = simt_backward_tiles(head_dim, kernel)
    return compile_kernel(pyfunc, signature, tiles.shared_bytes), tiles


# ----------------------------------------------------------------------------- compile & launch

# Options of every kernel compile (fast math: ``exp2`` becomes one ``ex2.approx``); the PTX
# checks compile with the same ones.
COMPILE_OPTIONS = {"fastmath": True}


def compile_kernel(pyfunc, signature, shared_bytes):
    """Compile ``pyfunc`` for ``signature`` (fast math: ``exp2`` becomes ``ex2.approx``) and let
    it use ``shared_bytes`` of dynamic shared memory. Under the simulator: a simulated kernel."""
    if SIMULATOR:
        return cuda.jit(pyfunc)
    kernel = cuda.jit(signature, **COMPILE_OPTIONS)(pyfunc)
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
