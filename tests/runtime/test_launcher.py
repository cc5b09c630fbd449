"""runtime/launcher.py: the hand-packed kernel parameter block (Numba's array ABI, natural
alignment, refusals) and a launch of a real kernel with strided views."""

import ctypes

import numpy as np
import pytest
from numba import cuda, types

from numba_flash.kernels.instructions import sync
from numba_flash.runtime import arrays, compiler, device, launcher
from helpers import SIMULATOR, to_device, to_host

U16_4D = types.Array(types.uint16, 4, "A")
F32_1D = types.Array(types.float32, 1, "A")


def device_tensor(shape, strides, itemsize, ptr, fmt="bfloat16"):
    return arrays.Tensor("x", None, "cupy", fmt, shape, strides, itemsize, ptr, 0, None)


def read(block, index, ctype):
    return ctype.from_address(block.pointers[index]).value


def test_parameter_block_follows_numbas_array_abi_and_alignment():
    block = launcher.ParameterBlock((U16_4D, types.int32, types.float32, F32_1D, types.int32,
                                    types.float64))
    offsets = [p - block.pointers[0] for p in block.pointers]
    # a 4-d array: meminfo, parent, nitems, itemsize, data, 4 extents, 4 byte strides
    assert offsets[:13] == [8 * i for i in range(13)]
    assert offsets[13:15] == [104, 108]           # int32, float32: 4-byte aligned
    assert offsets[15:22] == [112 + 8 * i for i in range(7)]
    assert offsets[22:] == [168, 176]             # int32, then float64 padded to 8

    q = device_tensor((2, 3, 5, 8), (240, 80, 16, 1), 2, 0x7F0000001230)
    o = device_tensor((7,), (3,), 4, 0x7F0000004000, "float32")
    values, device = block.values((q, 9, 0.5, o, -4, 1.25))
    assert device == 0
    block.format.pack_into(block.buffer, 0, *values)
    assert [read(block, i, ctypes.c_int64) for i in range(13)] == \
        [0, 0, 240, 2, 0x7F0000001230, 2, 3, 5, 8, 480, 160, 32, 2]
    assert read(block, 13, ctypes.c_int32) == 9 and read(block, 14, ctypes.c_float) == 0.5
    assert [read(block, 15 + i, ctypes.c_int64) for i in range(7)] == \
        [0, 0, 7, 4, 0x7F0000004000, 7, 12]
    assert read(block, 22, ctypes.c_int32) == -4 and read(block, 23, ctypes.c_double) == 1.25


@pytest.mark.parametrize("case", ["count", "ndim", "itemsize", "host", "not a tensor"])
def test_parameter_block_refuses_what_the_signature_does_not_take(case):
    block = launcher.ParameterBlock((U16_4D, types.int32))
    good = device_tensor((1, 2, 3, 8), (48, 24, 8, 1), 2, 4096)
    arg = {"ndim": device_tensor((2, 8), (8, 1), 2, 4096),
           "itemsize": device_tensor((1, 2, 3, 8), (48, 24, 8, 1), 4, 4096, "float32"),
           "host": arrays.adapt(np.zeros((1, 2, 3, 8), np.float16), "x") if SIMULATOR else None,
           "not a tensor": np.zeros((1, 2, 3, 8), np.uint16)}.get(case, good)
    if arg is None:
        pytest.skip("host arrays are refused by arrays.adapt on a GPU")
    args = (arg,) if case == "count" else (arg, 1)
    with pytest.raises(TypeError, match="launch:"):
        block.values(args)


class _Unlinkable:
    """A code library whose link needs a toolkit library that is not there (the cache off)."""

    def get_cufunc(self):
        from cuda.pathfinder import DynamicLibNotFoundError

        raise DynamicLibNotFoundError('Failure finding "libnvJitLink.so.13 or libnvJitLink.so.12"')


def test_a_link_at_the_first_launch_without_a_toolkit_library_names_the_extras():
    from numba_flash.runtime.env import CudaSetupError

    with pytest.raises(CudaSetupError, match=r"'libnvJitLink.*numba_flash\[cu13\]") as raised:
        launcher.Kernel(_Unlinkable(), (), 0).function(0)
    assert raised.value.__suppress_context__


def test_parameter_block_refuses_unknown_argument_types():
    with pytest.raises(TypeError, match="no parameter packing"):
        launcher.ParameterBlock((types.complex64,))


def probe(x, out, n, s):
    """out[i] = x[i, 1] * s + n, with x a strided 2-d view."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i, 1] * s + n


@pytest.mark.skipif(SIMULATOR, reason="the parameter block is the GPU launch path")
def test_launch_passes_strided_views_and_scalars_to_a_real_kernel(rng):
    f2 = types.Array(types.float32, 2, "A")
    kernel = compiler.compile_kernel(probe, types.void(f2, F32_1D, types.int32, types.float32), 0,
                                     device.current().cc)
    host = rng.standard_normal((40, 6)).astype(np.float32)
    x = arrays.adapt(to_device(host)[::2, 1:], "x")  # rows 2 apart, pointer one element in
    out = arrays.adapt(to_device(np.full(20, np.nan, np.float32)), "out")
    launcher.launch(kernel, (1,), 32, arrays.stream_of(out), 0, x, out, np.int32(3),
                    np.float32(0.5))
    np.testing.assert_array_equal(to_host(out.obj), host[::2, 2] * np.float32(0.5) + 3)


def test_launch_config_structures_follow_cuda_h():
    """CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union; CUlaunchConfig: seven
    32-bit sizes, then the stream, the attribute pointer and their count (x86-64 and aarch64)."""
    A, C = launcher.LaunchAttribute, launcher.LaunchConfig
    assert (ctypes.sizeof(A), A.value.offset) == (72, 8)
    assert (ctypes.sizeof(C), C.hStream.offset, C.attrs.offset, C.numAttrs.offset) == \
        (56, 32, 40, 48)


def slow_producer(x, out, spins):
    """out = 2 x, written after a long wait, by a kernel that lets its dependent start at once."""
    sync.launch_dependents()
    i = cuda.grid(1)
    acc = x[i]
    for _ in range(spins):  # a dependent that did not wait would read the old out
        acc = acc * np.float32(1.0000001)
    if i < out.shape[0]:
        out[i] = x[i] * 2 + (acc - acc)


def consumer(out, y):
    """y = out + 1, read after ``wait_prior_grid``."""
    sync.wait_prior_grid()
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = out[i] + 1


@pytest.mark.skipif(SIMULATOR or device.current().cc < (9, 0),
                    reason="programmatic dependent launch: a GPU of compute capability 9.0+")
def test_dependent_launch_waits_for_the_kernel_before_it(rng):
    """The wait, not the overlap: the consumer may start early and must still read what the
    slow producer wrote."""
    cc = device.current().cc
    first = compiler.compile_kernel(slow_producer, types.void(F32_1D, F32_1D, types.int32), 0,
                                    cc)
    second = compiler.compile_kernel(consumer, types.void(F32_1D, F32_1D), 0, cc)
    host = rng.standard_normal(4096).astype(np.float32)
    x = arrays.adapt(to_device(host), "x")
    out = arrays.adapt(to_device(np.zeros(4096, np.float32)), "out")
    y = arrays.adapt(to_device(np.full(4096, np.nan, np.float32)), "y")
    stream = arrays.stream_of(out)
    launcher.launch(first, (32,), 128, stream, 0, x, out, np.int32(200_000))
    launcher.launch(second, (32,), 128, stream, 0, out, y, dependent=True)
    np.testing.assert_array_equal(to_host(y.obj), host * 2 + 1)


@pytest.mark.parametrize("version, takes", [(12020, False), (12030, True), (13000, True)])
def test_programmatic_launches_need_a_driver_that_captures_them(monkeypatch, version, takes):
    class FakeLibcuda:
        def cuDriverGetVersion(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int)).contents.value = version
            return 0

    monkeypatch.setattr(launcher, "libcuda", FakeLibcuda)
    monkeypatch.setattr(launcher, "_driver_version", [])
    assert launcher._programmatic_launches() is takes
