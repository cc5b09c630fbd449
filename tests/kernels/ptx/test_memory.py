"""The memory instructions of kernels/ptx/memory.py: cp.async (16-byte, zfill, from an element
or an address) and its groups, shared and global addresses, 16-byte global stores; and the
emulation's refusal of the misaligned addresses that stop a GPU kernel
(cudaErrorMisalignedAddress)."""

import numpy as np
import pytest
from numba import cuda, float32, uint16, uint64

from helpers import SIMULATOR, to_device, to_host
from numba_flash.kernels.instructions import memory

SHARED_ALIGN = memory.SHARED_ALIGN


@cuda.jit
def _copy_kernel(g16, g32, row_ok, s_out16, s_out32, addr):
    """cp.async of 16-byte chunks: uint16 rows of a 2-D array (8 elements a chunk, zero-filled
    rows where ``row_ok`` is 0) and a 1-D float32 array (4 elements a chunk); ``addr`` gets
    shared addresses: of s16[0], s16[8] - s16[0], s32[4] - s32[0]."""
    tid = cuda.threadIdx.x
    s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    s32 = cuda.shared.array(64, float32, alignment=SHARED_ALIGN)
    row = tid >> 2
    col = (tid & 3) * 8
    memory.cp_async_16_zfill(s16, row * 32 + col, g16, (row, col), row_ok[row] != 0)
    memory.cp_async_16(s32, tid * 4, g32, tid * 4)
    memory.cp_async_commit()
    memory.cp_async_wait_all()
    cuda.syncthreads()
    for j in range(8):
        s_out16[tid * 8 + j] = s16[tid * 8 + j]
    for j in range(4):
        s_out32[tid * 4 + j] = s32[tid * 4 + j]
    if tid == 0:
        addr[0] = memory.shared_address(s16, 0)
        addr[1] = memory.shared_address(s16, 8) - memory.shared_address(s16, 0)
        addr[2] = memory.shared_address(s32, 4) - memory.shared_address(s32, 0)


def test_cp_async_copies():
    rng = np.random.default_rng(5)
    g16 = rng.integers(1, 1 << 16, size=(4, 32), dtype=np.uint16)
    g32 = rng.standard_normal(64).astype(np.float32)
    row_ok = np.array([1, 0, 1, 1], np.int32)
    out16 = np.zeros(128, np.uint16)
    out32 = np.zeros(64, np.float32)
    addr = np.zeros(3, np.uint32)
    _copy_kernel[1, 16](g16, g32, row_ok, out16, out32, addr)
    want = g16 * row_ok[:, None].astype(np.uint16)
    np.testing.assert_array_equal(out16.reshape(4, 32), want)
    np.testing.assert_array_equal(out32, g32)
    assert addr[0] % 16 == 0  # SHARED_ALIGN
    assert (addr[1], addr[2]) == (16, 16)  # byte offsets


@cuda.jit
def _byte_copy_kernel(g8, s_out):
    """cp.async of 16 bytes of a uint8 row into uint16 shared memory (FP8 caches land so)."""
    s16 = cuda.shared.array(8, uint16, alignment=SHARED_ALIGN)
    memory.cp_async_16(s16, 0, g8, (1, 0))
    memory.cp_async_commit()
    memory.cp_async_wait_all()
    for j in range(8):
        s_out[j] = s16[j]


def test_cp_async_moves_bytes_between_arrays_of_other_element_sizes():
    g8 = np.random.default_rng(7).integers(0, 256, size=(2, 16), dtype=np.uint8)
    out = np.zeros(8, np.uint16)
    _byte_copy_kernel[1, 1](g8, out)
    np.testing.assert_array_equal(out, g8[1].view(np.uint16))


@cuda.jit
def _copy_at_kernel(g16, rows, s_out):
    """cp.async from addresses: thread t copies chunk t % 4 of row rows[t // 4] of g16 (its
    address: global_address of row 0 plus rows * the row stride), zero-filled where rows < 0."""
    tid = cuda.threadIdx.x
    s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    row, chunk = rows[tid >> 2], tid & 3
    base = memory.global_address(g16, (0, chunk * 8))
    memory.cp_async_16_zfill_at(s16, tid * 8, base + uint64(max(row, 0) * g16.strides[0]),
                                row >= 0)
    memory.cp_async_commit()
    memory.cp_async_wait_all()
    cuda.syncthreads()
    for j in range(8):
        s_out[tid * 8 + j] = s16[tid * 8 + j]


def test_cp_async_from_an_address_copies_that_row_or_zeros():
    g16 = np.random.default_rng(6).integers(1, 1 << 16, size=(5, 32), dtype=np.uint16)
    rows = np.array([3, -1, 0, 4], np.int32)
    out = np.zeros(128, np.uint16)
    _copy_at_kernel[1, 16](to_device(g16), to_device(rows), out)
    want = np.where(rows[:, None] >= 0, g16[np.maximum(rows, 0)], 0)
    np.testing.assert_array_equal(to_host(out).reshape(4, 32), want)


@cuda.jit
def _store_kernel(src, dst, addr):
    """Rows of ``src`` staged in shared memory, then written to ``dst`` (3-D, the chunks along
    its last dimension) at the addresses ``global_address`` gives: one 16-byte store where the
    chunk is 16-byte aligned (a misaligned one faults), eight 16-bit stores where it is not.
    ``addr`` gets each chunk's address modulo 16."""
    tid = cuda.threadIdx.x
    s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    for j in range(8):
        s16[tid * 8 + j] = src[tid * 8 + j]
    cuda.syncthreads()
    a = memory.global_address(dst, (tid >> 3, (tid >> 2) & 1, (tid & 3) * 8))
    addr[tid] = a & 15
    if a & 15 == 0:
        memory.st_global_16(a, s16, tid * 8)
    else:
        memory.st_global_16_unaligned(a, s16, tid * 8)


@pytest.mark.parametrize("offset", [0, 8, 4])
def test_16_byte_stores_and_global_addresses(offset):
    """Rows of 80 bytes: a view starting 0 or 8 elements in is 16-byte aligned, 4 is not."""
    rng = np.random.default_rng(6)
    src = rng.integers(1, 1 << 16, size=128, dtype=np.uint16)
    device = cuda.to_device if SIMULATOR else to_device  # the simulator launches views of these
    dst = device(np.zeros((2, 2, 40), np.uint16))
    addr = device(np.full(16, -1, np.int64))
    _store_kernel[1, 16](src, dst[..., offset:offset + 32], addr)
    got, addr = to_host(dst), to_host(addr)
    np.testing.assert_array_equal(addr, 0 if offset % 8 == 0 else 8)
    np.testing.assert_array_equal(got[..., offset:offset + 32].reshape(-1), src)
    assert not got[..., :offset].any() and not got[..., offset + 32:].any()


# ---- simulator only: what would crash the GPU is refused -------------------------------------

@cuda.jit
def _copy_row_kernel(q, smem_offset, out):
    """One thread: cp.async of q[0, 1, 0, 0:8] (a 16-byte chunk of a (B, S, H, D) row) into
    shared memory at element ``smem_offset``, then back out."""
    s16 = cuda.shared.array(32, uint16, alignment=SHARED_ALIGN)
    memory.cp_async_16(s16, smem_offset, q, (0, 1, 0, 0))
    memory.cp_async_commit()
    memory.cp_async_wait_all()
    cuda.syncthreads()
    for j in range(8):
        out[j] = s16[smem_offset + j]


def _q_view(bytes_off):
    """A q-like (B, S, H, D) = (1, 4, 1, 32) uint16 device view whose rows (96-byte strides,
    16-byte multiples) all start ``bytes_off`` bytes past a 16-byte boundary, and its values."""
    rng = np.random.default_rng(9)
    host = rng.integers(1, 1 << 16, size=(1, 4, 1, 48), dtype=np.uint16)
    buf = cuda.to_device(host)
    base = buf.__array_interface__["data"][0]
    start = ((bytes_off - base) % 16) // 2  # elements to skip for that alignment
    view = buf[..., start:start + 32]
    assert view.__array_interface__["data"][0] % 16 == bytes_off
    return view, host[..., start:start + 32]


@pytest.mark.skipif(not SIMULATOR, reason="a misaligned cp.async stops a GPU kernel")
def test_cp_async_emulation_refuses_misaligned_global_address():
    q, values = _q_view(8)
    out = np.zeros(8, np.uint16)
    with pytest.raises(memory.MisalignedAddress,
                       match=r"cp\.async global \(source\) address .* 8 bytes off 16-byte "
                             r"alignment.*cudaErrorMisalignedAddress"):
        _copy_row_kernel[1, 1](q, 0, out)
    q, values = _q_view(0)  # the same copy from an aligned view goes through
    _copy_row_kernel[1, 1](q, 0, out)
    np.testing.assert_array_equal(out, values[0, 1, 0, :8])


@pytest.mark.skipif(not SIMULATOR, reason="a misaligned cp.async stops a GPU kernel")
def test_cp_async_emulation_refuses_misaligned_shared_address():
    q, _ = _q_view(0)
    out = np.zeros(8, np.uint16)
    with pytest.raises(memory.MisalignedAddress,
                       match=r"cp\.async shared \(destination\) address 0x8 .*element 4"):
        _copy_row_kernel[1, 1](q, 4, out)


@pytest.mark.skipif(not SIMULATOR, reason="a misaligned 16-byte store stops a GPU kernel")
def test_st_global_16_emulation_refuses_misaligned_address():
    src = np.arange(128, dtype=np.uint16)
    dst, _ = _q_view(8)  # kernels pick st_global_16_unaligned here; this one does not

    @cuda.jit
    def kernel(src, dst):
        s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
        for j in range(8):
            s16[j] = src[j]
        memory.st_global_16(memory.global_address(dst, (0, 1, 0, 0)), s16, 0)

    with pytest.raises(memory.MisalignedAddress, match=r"st\.global\.v4 .* 8 bytes off"):
        kernel[1, 1](src, dst)
