"""FP8 quantization (kernels/simt/quantize.py, ``nf.quantize_fp8``) against NumPy doing the same
float32 steps (amax per (batch, head), descale = amax / 448, x * (1 / descale) rounded to the
nearest even e4m3 after saturating): bit for bit, every input format, 3-D and 4-D inputs,
sequence lengths past one CTA's rows, strided inputs, a caller's descale, zero and NaN rows;
the dequantized values within e4m3's half-ulp of x; refusals that write nothing."""

import ml_dtypes
import numpy as np
import pytest

import numba_flash as nf
from helpers import (SIMULATOR, assert_compiles_clean, later_samples, randn, to_host,
                     torch_device)
from numba_flash.kernels.simt import quantize

E4M3 = ml_dtypes.float8_e4m3fn
torch = None if SIMULATOR else pytest.importorskip("torch")

SHAPES = [((2, 40, 3, 16), "bfloat16"), ((45, 2, 24), "float16"), ((1, 5, 1, 8), "float32")]
if not SIMULATOR:
    SHAPES += [((4, 4096, 8, 128), "bfloat16"), ((3000, 4, 256), "float16")]


def reference(x, descale=None):
    """(bits of x_fp8, descale) as the kernels compute them, in NumPy float32 (x (B, S, H, D))."""
    x32 = x.astype(np.float32)
    if descale is None:
        amax = np.nanmax(np.abs(x32), axis=(1, 3))  # (B, H)
        descale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0))
        descale = descale.astype(np.float32)
    inv = (np.float32(1.0) / descale).astype(np.float32)
    scaled = x32 * inv[:, None, :, None]
    scaled = np.where(np.isnan(scaled), scaled, np.clip(scaled, -448.0, 448.0))
    return scaled.astype(np.float32).astype(E4M3).view(np.uint8), descale


def as_4d(x):
    return x if x.ndim == 4 else x[None]


@pytest.mark.parametrize("shape, fmt", SHAPES, ids=lambda c: str(c))
def test_quantization_matches_numpy_bit_for_bit(shape, fmt, rng):
    x = randn(rng, shape, fmt, scale=3.0)
    x[..., 1] *= 40.0  # an outlier channel sets the scale
    got, descale = nf.quantize_fp8(torch_device(x))
    bits, want_descale = reference(as_4d(x))
    np.testing.assert_array_equal(to_host(descale), want_descale)
    np.testing.assert_array_equal(as_4d(to_host(got)).view(np.uint8), bits)
    # and x comes back to within half an e4m3 step (relative 2^-4) of its scaled value
    back = as_4d(to_host(got)).astype(np.float32) * want_descale[:, None, :, None]
    x32 = as_4d(x).astype(np.float32)
    assert np.all(np.abs(back - x32) <= np.abs(x32) * 2.0 ** -4 + want_descale.max() * 2.0 ** -9)


def test_a_given_descale_a_strided_input_and_a_buffer(rng):
    """A caller's descale (too small for one head: its values saturate at 448), q sliced out
    of a packed qkv array, and an ``out=`` buffer of the caller's."""
    qkv = randn(rng, (2, 40, 3, 4, 16), "bfloat16")
    x = qkv[:, :, 0]  # strided over the sequence
    descale = np.array([[0.001, 0.5, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    out = torch_device(np.full(x.shape, np.nan, np.float32).astype(E4M3))
    got, got_descale = nf.quantize_fp8(torch_device(qkv)[:, :, 0], descale=torch_device(descale),
                                       out=out)
    assert got is out
    bits, _ = reference(x, descale)
    np.testing.assert_array_equal(to_host(got).view(np.uint8), bits)
    np.testing.assert_array_equal(to_host(got_descale), descale)
    assert (np.abs(to_host(got)[0, :, 0].astype(np.float32)) == 448.0).any()  # saturated


def test_zero_heads_get_descale_one_and_nans_stay_nan(rng):
    x = randn(rng, (1, 37, 2, 8), "float32")
    x[:, :, 0] = 0.0
    x[0, 3, 1, 2] = np.nan
    got, descale = nf.quantize_fp8(torch_device(x))
    bits, want = reference(x)
    assert to_host(descale)[0, 0] == 1.0
    np.testing.assert_array_equal(to_host(descale), want)
    np.testing.assert_array_equal(to_host(got).view(np.uint8), bits)
    assert np.isnan(to_host(got)[0, 3, 1, 2].astype(np.float32))


def test_split_rows_keep_the_grid_in_range():
    assert quantize.split_rows(70) == (32, 3)
    assert quantize.split_rows(1) == (32, 1)
    rows, splits = quantize.split_rows(10 ** 7)
    assert splits <= quantize.MAX_SPLITS and rows * splits >= 10 ** 7 > rows * (splits - 1)


def test_refusals_write_nothing(rng):
    x = randn(rng, (1, 4, 2, 16), "float32")
    out = torch_device(np.full(x.shape, np.nan, np.float32).astype(E4M3))
    for kwargs, err, match in (
            (dict(descale=torch_device(np.ones((2, 2), np.float32))), ValueError, "descale"),
            (dict(descale=torch_device(np.ones((1, 2), np.float16))), TypeError, "descale"),
            (dict(out=torch_device(np.zeros((1, 4, 2, 16), np.float32))), ValueError, "out")):
        with pytest.raises(err, match=match):
            nf.quantize_fp8(torch_device(x), out=kwargs.pop("out", out), **kwargs)
    with pytest.raises(TypeError, match="x"):
        nf.quantize_fp8(torch_device(x.astype(np.float64)))
    assert np.isnan(to_host(out).astype(np.float32)).all()


def test_every_specialization_compiles_without_spills():
    assert_compiles_clean("simt.quantize:QUANTIZE", later_samples(quantize.QUANTIZE),
                          must_contain=("cvt.rn.satfinite.e4m3x2.f32",), ccs=((9, 0),))
