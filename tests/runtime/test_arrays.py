"""The device-array adapter: libraries, dtypes as bit views, strides, allocation, zero copy."""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import numba_flash as nf
from numba_flash.runtime import arrays
from helpers import DTYPES, SIMULATOR, randn, to_device, to_host


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
def test_adapt_keeps_format_shape_and_strides(fmt, rng):
    x = to_device(randn(rng, (2, 3, 4, 8), fmt))[:, 1:, ::2]
    t = arrays.adapt(x, "x")
    assert t.fmt == fmt and t.shape == (2, 2, 2, 8)
    assert t.strides == (3 * 4 * 8, 4 * 8, 2 * 8, 1)
    assert np.dtype(t.view.dtype) == (np.float32 if fmt == "float32" else np.uint16)


def test_records_carry_the_address_of_element_zero():
    """launcher.launch passes ``ptr`` and the element strides to kernels, so a strided view must
    keep its own start address."""
    x = to_device(np.zeros((4, 6), np.float32))[1:, 2:]
    t = arrays.adapt(x, "x")
    iface = getattr(x, "__cuda_array_interface__", None) or x.__array_interface__
    assert t.ptr == iface["data"][0] and t.strides == (6, 1) and t.itemsize == 4


def test_bfloat16_bits_are_shared_not_copied(rng):
    x = to_device(randn(rng, (1, 2, 1, 8), "bfloat16"))
    t = arrays.adapt(x, "x")
    host_bits = to_host(x).view(np.uint16)
    assert np.array_equal(to_host(t.view), host_bits)


def test_numba_device_arrays_in_give_numba_arrays_out(rng):
    q, k, v = (cuda.to_device(randn(rng, (1, 4, 1, 8), "float32")) for _ in range(3))
    out, lse = nf.flash_attn_fwd(q, k, v)
    assert getattr(out, "__cuda_ndarray__", False) and getattr(lse, "__cuda_ndarray__", False)
    assert out.shape == (1, 4, 1, 8) and lse.shape == (1, 1, 4)


def test_empty_allocates_in_the_library_of_its_argument():
    like = arrays.adapt(to_device(np.zeros((2, 2), np.float32)), "like")
    t = arrays.empty(like, (3, 5), "bfloat16", "out")
    assert t.shape == (3, 5) and t.fmt == "bfloat16" and t.lib == like.lib
    assert to_host(t.obj).dtype == ml_dtypes.bfloat16


def test_unsupported_objects_are_type_errors():
    with pytest.raises(TypeError, match="x: expected a CuPy array"):
        arrays.adapt("not an array", "x")


def test_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    dev = "cpu" if SIMULATOR else "cuda"
    q = torch.randn(1, 5, 2, 16, dtype=torch.bfloat16, device=dev, requires_grad=True)
    out = nf.flash_attn_func(q, q[:, :, :1], q[:, :, 1:], backend="simt")  # grad leaves are fine
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.device == q.device


def test_16_byte_rows_check_pointer_row_length_and_strides():
    cache = to_device(np.zeros((3, 4, 2, 24), DTYPES["bfloat16"]))
    wider = to_device(np.zeros((3, 4, 2, 28), DTYPES["bfloat16"]))

    def copies_16(x):
        return arrays.rows_16_byte_aligned(arrays.adapt(x, "k_cache"))

    assert copies_16(cache)
    assert copies_16(cache[..., 8:])  # pointer + 16 bytes, rows of 32
    assert not copies_16(cache[..., 1:17])  # pointer + 2 bytes
    assert copies_16(cache[:, ::3, 1:])  # strides 288 and 96 bytes
    assert not copies_16(cache[:, ::3, :, :20])  # rows of 40 bytes
    assert not copies_16(wider[..., :24])  # head stride 56 bytes
