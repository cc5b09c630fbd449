"""The simulator's ``memory``: cp.async, addresses and 16-byte stores (``kernels/ptx/memory.py``
has the instructions and the API), as immediate copies in host memory.

Addresses. The simulator has no shared state space: ``shared_address`` gives the element's byte
offset in its array, which on a GPU is the address minus a base aligned to ``SHARED_ALIGN``, so
the two agree modulo 16 (``alignment=`` itself is refused by the simulator: ``SHARED_ALIGN`` is
None here). Simulated global memory is host memory, and ``global_address`` gives the element's
real host address, data pointer plus index times strides: its alignment is what the GPU's would
be for the same view.

Alignment. On a GPU a cp.async or ``st.global.v4`` at an address that is not a multiple of 16
stops the kernel with ``cudaErrorMisalignedAddress``. The emulations refuse such an address with
``MisalignedAddress`` naming the array, the index and the address, so the simulator catches the
views and offsets that would crash the GPU.

Asynchrony. An emulated copy completes at issue, so commit and the waits have nothing to do; a
kernel that forgets a wait still works here, one that reads before its ``syncthreads`` may not.
"""

import ctypes

import numpy as np
from numba import cuda

from ..ptx.layout import CP_ASYNC_BYTES

# ``cuda.shared.array(..., alignment=SHARED_ALIGN)``: the simulator refuses the argument.
SHARED_ALIGN = None


class MisalignedAddress(ValueError):
    """A 16-byte access at an address that is not 16-byte aligned: on a GPU the kernel would
    stop with ``cudaErrorMisalignedAddress``."""


def _element_address(gmem, index):
    """Host byte address of ``gmem[index]``: data pointer plus index times strides."""
    if not isinstance(index, tuple):
        index = (index,)
    base = gmem.__array_interface__["data"][0]
    return base + sum(int(i) * s for i, s in zip(index, gmem.strides))


def _require_aligned(what, address, detail):
    if address % CP_ASYNC_BYTES:
        raise MisalignedAddress(
            f"{what} address {address:#x} ({detail}) is {address % CP_ASYNC_BYTES} bytes off "
            f"{CP_ASYNC_BYTES}-byte alignment: on a GPU this access stops the kernel with "
            f"cudaErrorMisalignedAddress")


@cuda.jit(device=True)
def shared_address(smem, offset):
    """The simulator has no shared address space: the element's byte offset in its array
    stands in for it."""
    return np.uint32(int(offset) * smem.itemsize)


@cuda.jit(device=True)
def global_address(gmem, index):
    """The element's real host address: its alignment is what the GPU's would be."""
    return np.uint64(_element_address(gmem, index))


# ---- cp.async ----------------------------------------------------------------------------------

def _copy16(smem, offset, gmem, index, valid):
    if not smem.flags.c_contiguous:
        raise ValueError("cp.async destination must be a C-contiguous shared array")
    flat = smem.reshape(-1)
    offset = int(offset)
    # The GPU needs both addresses aligned whether or not the zfill form reads the source.
    _require_aligned("cp.async shared (destination)", offset * flat.itemsize,
                     f"element {offset} of the shared array")
    _require_aligned("cp.async global (source)", _element_address(gmem, index),
                     f"index {index} of a {gmem.dtype} array with strides {gmem.strides}")
    if gmem.itemsize == flat.itemsize:  # (the common case: element for element)
        n = CP_ASYNC_BYTES // flat.itemsize
        if isinstance(index, tuple):
            head, last = tuple(index[:-1]), int(index[-1])
            for j in range(n):
                flat[offset + j] = gmem[head + (last + j,)] if valid else 0
        else:
            for j in range(n):
                flat[offset + j] = gmem[int(index) + j] if valid else 0
        return
    # Bytes, as the GPU moves them: the source's elements need not be the destination's.
    chunk = np.zeros(CP_ASYNC_BYTES // gmem.itemsize, gmem.dtype)
    if valid:
        if isinstance(index, tuple):
            head, last = tuple(index[:-1]), int(index[-1])
            for j in range(chunk.size):
                chunk[j] = gmem[head + (last + j,)]
        else:
            for j in range(chunk.size):
                chunk[j] = gmem[int(index) + j]
    start = offset * flat.itemsize
    flat.view(np.uint8)[start:start + CP_ASYNC_BYTES] = chunk.view(np.uint8)


@cuda.jit(device=True)
def cp_async_16(smem, offset, gmem, index):
    """Copy 16 bytes ``gmem[index...]`` -> ``smem.flat[offset...]`` (emulated: at once)."""
    _copy16(smem, offset, gmem, index, True)


@cuda.jit(device=True)
def cp_async_16_zfill(smem, offset, gmem, index, valid):
    """Like ``cp_async_16``; writes 16 zero bytes instead when ``valid`` is false."""
    _copy16(smem, offset, gmem, index, valid)


@cuda.jit(device=True)
def cp_async_16_zfill_at(smem, offset, address, valid):
    """``cp_async_16_zfill`` from the host address ``global_address`` (plus byte offsets)
    gives: 16 bytes copied from there, or 16 zero bytes when ``valid`` is false."""
    flat = smem.reshape(-1)
    n = CP_ASYNC_BYTES // flat.itemsize
    offset = int(offset)
    _require_aligned("cp.async shared (destination)", offset * flat.itemsize,
                     f"element {offset} of the shared array")
    _require_aligned("cp.async global (source)", int(address), "an address from global_address")
    chunk = np.zeros(n, flat.dtype)
    if valid:
        ctypes.memmove(chunk.ctypes.data, int(address), CP_ASYNC_BYTES)
    flat[offset:offset + n] = chunk


@cuda.jit(device=True)
def cp_async_commit():
    """Close the current group of copies (nothing to do: emulated copies are immediate)."""
    return None


@cuda.jit(device=True)
def cp_async_wait(n):
    """Wait until at most ``n`` groups are in flight (nothing to do under the simulator)."""
    return None


@cuda.jit(device=True)
def cp_async_wait_all():
    """Wait for every copy issued so far (nothing to do under the simulator)."""
    return None


# ---- 16-byte stores ----------------------------------------------------------------------------

def _store16(address, smem, offset):
    """Simulated global memory is host memory, and ``global_address`` gives its real
    addresses: the store is a plain copy of 16 bytes to that address."""
    flat = smem.reshape(-1)
    n = CP_ASYNC_BYTES // flat.itemsize
    chunk = np.ascontiguousarray(flat[int(offset):int(offset) + n])
    ctypes.memmove(int(address), chunk.ctypes.data, CP_ASYNC_BYTES)


@cuda.jit(device=True)
def st_global_16(address, smem, offset):
    """Store the 16 bytes ``smem.flat[offset...]`` at global ``address`` (16-byte aligned)."""
    _require_aligned("st.global.v4 (destination)", int(address), "global_address of the chunk")
    _store16(address, smem, offset)


@cuda.jit(device=True)
def st_global_16_unaligned(address, smem, offset):
    """Like ``st_global_16``, at any 2-byte-aligned address."""
    _store16(address, smem, offset)
