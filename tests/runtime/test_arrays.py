"""The device-array adapter: libraries, dtypes as bit views, strides, allocation, zero copy."""

import sys
import types

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import numba_flash as nf
from numba_flash.runtime import arrays
from numba_flash import reference as ref
from helpers import DTYPES, SIMULATOR, assert_close_rule, assert_lse, randn, to_device, to_host


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


def test_fp8_arrays_are_viewed_as_their_bytes(rng):
    """float8_e4m3fn from torch (and NumPy under the simulator) reaches kernels as uint8 bits,
    shared with the caller's memory; torch allocates FP8 results."""
    torch = pytest.importorskip("torch")
    dev = "cpu" if SIMULATOR else "cuda"
    x = torch.randn(2, 3, 1, 16, device=dev).to(torch.float8_e4m3fn)
    t = arrays.adapt(x, "x")
    assert t.fmt == "float8_e4m3fn" and t.itemsize == 1 and t.strides == (48, 16, 16, 1)
    np.testing.assert_array_equal(to_host(t.view), x.cpu().view(torch.uint8).numpy())
    out = arrays.empty(t, (4, 8), "float8_e4m3fn", "out")
    assert out.obj.dtype == torch.float8_e4m3fn and out.obj.device == x.device
    if SIMULATOR:
        h = randn(rng, (3, 8), "float32").astype(ml_dtypes.float8_e4m3fn)
        np.testing.assert_array_equal(to_host(arrays.adapt(h, "h").view), h.view(np.uint8))


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


def test_strided_views_merge_axes_and_swapped_views_are_the_librarys_own(rng):
    """``strided``: the same memory seen as (b s_q, 1, h) (what the sparse decode hands its
    kernels); ``swapped``: the caller's library's transposed view of it."""
    x = to_device(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    t = arrays.adapt(x, "x")
    merged = arrays.strided(t, (6, 1, 4), (4, 4, 1))
    assert merged.shape == (6, 1, 4) and merged.strides == (4, 4, 1) and merged.ptr == t.ptr
    if SIMULATOR:
        np.testing.assert_array_equal(np.asarray(merged.view._ary)[:, 0], to_host(x).reshape(6, 4))
    for obj in (x, cuda.to_device(to_host(x))):
        swapped = arrays.swapped(arrays.adapt(obj, "x"), 1, 2)
        assert swapped.shape == (2, 4, 3) and swapped.strides == (12, 1, 4)
        if SIMULATOR or obj is x:
            np.testing.assert_array_equal(to_host(swapped.obj), to_host(x).transpose(0, 2, 1))
        else:  # a Numba view over the same memory, with the swapped strides
            face = swapped.obj.__cuda_array_interface__
            assert face["shape"] == (2, 4, 3) and face["strides"] == (48, 4, 16)
            assert face["data"][0] == arrays.adapt(obj, "x").ptr


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


# ----------------------------------------------------------------------------- other libraries

class _Producer:
    """An array of no library the adapter knows: only the DLPack protocol, over NumPy memory
    under the simulator (CuPy memory on a GPU)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class _InterfaceProducer:
    """Only ``__cuda_array_interface__``."""

    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


def test_a_dlpack_producer_is_read_zero_copy_with_its_strides(rng):
    x = to_device(randn(rng, (2, 3, 4, 8), "float16"))[:, 1:, ::2]
    t = arrays.adapt(_Producer(x), "x")
    iface = getattr(x, "__cuda_array_interface__", None) or x.__array_interface__
    assert t.lib == "foreign" and t.fmt == "float16" and t.shape == (2, 2, 2, 8)
    assert t.ptr == iface["data"][0] and t.strides == (3 * 4 * 8, 4 * 8, 2 * 8, 1)


def test_dlpack_producers_in_give_dlpack_results_out(rng):
    """A caller whose library has no ``from_dlpack`` gets results that any DLPack consumer
    takes (here NumPy's or CuPy's)."""
    host = [randn(rng, (1, 5, 2, 16), "float16") for _ in range(3)]
    out, lse = nf.flash_attn_fwd(*(_Producer(to_device(x)) for x in host), causal=True)
    assert hasattr(out, "__dlpack__") and hasattr(lse, "__dlpack__")
    take = np.from_dlpack if SIMULATOR else __import__("cupy").from_dlpack
    want, want_lse = ref.attention_fwd_ref(*host, causal=True)
    assert_close_rule(to_host(take(out)), want, ref.attention_lowp(*host, causal=True), "float16")
    assert_lse(to_host(take(lse)), want_lse)


def test_results_go_to_the_from_dlpack_of_the_callers_library(rng, monkeypatch):
    """A library with a ``from_dlpack`` (JAX's is ``jax.numpy.from_dlpack``) gets its own arrays
    back, sharing the memory the kernels wrote."""
    library = types.ModuleType("toylib")

    class ToyArray(_Producer):
        pass

    ToyArray.__module__ = "toylib"
    take = np.from_dlpack if SIMULATOR else __import__("cupy").from_dlpack
    library.from_dlpack = lambda x: ToyArray(take(x))
    monkeypatch.setitem(sys.modules, "toylib", library)
    host = [randn(rng, (1, 4, 1, 8), "float32") for _ in range(3)]
    out, lse = nf.flash_attn_fwd(*(ToyArray(to_device(x)) for x in host))
    assert type(out) is ToyArray and type(lse) is ToyArray
    want, want_lse = ref.attention_fwd_ref(*host)
    assert_close_rule(to_host(out.array), want, None, "float32")
    assert_lse(to_host(lse.array), want_lse)


def test_jax_arrays_in_give_jax_arrays_out(rng):
    """Real JAX arrays (on the CPU under the simulator, on the GPU elsewhere) through DLPack:
    the forward and the backward read them zero-copy and hand JAX arrays back."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    host = [randn(rng, (1, 6, 2, 16), "float16") for _ in range(4)]
    q, k, v, dout = (jax.device_put(x, jax.devices("cpu" if SIMULATOR else "gpu")[0])
                     for x in host)
    out, lse = nf.flash_attn_fwd(q, k, v, causal=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    want, want_lse = ref.attention_fwd_ref(*host[:3], causal=True)
    assert_close_rule(np.asarray(out), want, ref.attention_lowp(*host[:3], causal=True),
                      "float16")
    assert_lse(np.asarray(lse), want_lse)
    jax.block_until_ready((out, lse))
    grads = nf.flash_attn_bwd(dout, q, k, v, out, lse, causal=True)
    if not SIMULATOR:
        cuda.synchronize()  # other libraries' arrays are not ordered against JAX's streams
    for got, w in zip(grads, ref.attention_bwd_ref(host[3], *host[:3], causal=True)):
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(np.asarray(got, np.float64), w, atol=3e-2)
    assert jnp.isfinite(grads[0]).all()


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's refusal")
def test_an_interface_producer_under_the_simulator_is_a_type_error():
    with pytest.raises(TypeError, match="^q: under the simulator"):
        nf.flash_attn_fwd(_InterfaceProducer(dict(shape=(1, 4, 1, 8), typestr="<f4",
                                                  data=(0, False), version=3)),
                          *(np.zeros((1, 4, 1, 8), np.float32) for _ in range(2)))


@pytest.mark.skipif(SIMULATOR, reason="__cuda_array_interface__ describes device memory")
def test_an_interface_producer_is_read_zero_copy(rng):
    x = cuda.to_device(randn(rng, (2, 3, 4, 8), "float32"))[:, 1:]
    t = arrays.adapt(_InterfaceProducer(x.__cuda_array_interface__), "x")
    assert t.lib == "foreign" and t.ptr == x.__cuda_array_interface__["data"][0]
    assert t.shape == (2, 2, 4, 8) and t.strides == (3 * 4 * 8, 4 * 8, 8, 1)


def test_bfloat16_results_that_dlpack_cannot_export_are_refused_before_launch(rng):
    torch = pytest.importorskip("torch")
    x = randn(rng, (1, 4, 1, 8), "bfloat16")
    bits = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    q = _Producer(bits if SIMULATOR else bits.cuda())
    with pytest.raises(TypeError, match="^out: a bfloat16 result cannot be handed"):
        nf.flash_attn_fwd(q, q, q)
