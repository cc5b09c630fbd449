"""The conversions of kernels/ptx/convert.py: float32 pairs packed to f16x2 / bf16x2 with
round-to-nearest-even, unpacked back, and ex2.approx.ftz; on the simulator (the emulations) or a
GPU (the instructions), and their PTX compiled in a child process."""

import pathlib

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from numba_flash.runtime import ptxcheck

from kernels.ptx import _ptx_kernels as K


def _rne_cases(rng):
    """float32 pairs: random magnitudes, exact halfway cases for float16 and for bfloat16,
    overflow, float16 subnormals, signed zeros."""
    x = [rng.standard_normal(64) * 10.0 ** rng.integers(-6, 6, 64)]
    f16 = rng.standard_normal(64).astype(np.float16)
    nxt = np.nextafter(f16, np.float16(np.inf))
    x.append((f16.astype(np.float32) + nxt.astype(np.float32)) / 2)  # float16 ties
    bf = rng.integers(0, 1 << 16, 64, dtype=np.uint32) & 0xFF7F  # finite bfloat16 bits
    x.append(((bf << 16) | 0x8000).view(np.float32))  # bfloat16 ties (odd and even mantissas)
    x.append(((bf << 16) | 0x8001).view(np.float32))
    x.append(np.array([65504.0, 65520.0, 70000.0, -1e30, 6e-8, -3e-6, 0.0, -0.0]))
    x = np.concatenate(x).astype(np.float32)
    x = np.concatenate([x, x[::-1]])
    return x[: len(x) // 2 * 2].reshape(-1, 2)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_pack_round_to_nearest_even():
    rng = np.random.default_rng(4)
    x = _rne_cases(rng)
    xe = np.concatenate([rng.uniform(-30, 30, len(x) - 4), [0.0, 1.0, -126.5, -200.0]])
    xe = xe.astype(np.float32)
    f16 = np.zeros(len(x), np.uint32)
    bf16 = np.zeros(len(x), np.uint32)
    unpacked = np.full((len(x), 4), np.nan, np.float32)
    e2 = np.full(len(x), np.nan, np.float32)
    kernel = cuda.jit(K.conversions()[0])
    kernel[2, 32](x, f16, bf16, unpacked, xe, e2)
    want16 = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    wantbf = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    # lo (the first value) in bits 0-15, hi in bits 16-31
    np.testing.assert_array_equal(f16, want16[:, 0] | (want16[:, 1] << 16))
    np.testing.assert_array_equal(bf16, wantbf[:, 0] | (wantbf[:, 1] << 16))
    np.testing.assert_array_equal(unpacked[:, 0:2], x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(unpacked[:, 2:4], x.astype(ml_dtypes.bfloat16).astype(np.float32))
    ref = np.exp2(xe.astype(np.float64))
    ref[ref < 2.0 ** -126] = 0.0  # .ftz
    np.testing.assert_allclose(e2, ref, rtol=2e-6, atol=0)


def test_e4m3_rounds_to_nearest_even_saturates_and_decodes_exactly():
    """Every e4m3 code decodes to ml_dtypes' value; float32 rounds to the nearest even e4m3
    (ties between codes, subnormals, signed zeros), values past +-448 saturate and NaN stays
    NaN; rcp.approx within 1 ulp; a pair of codes widens to the pair of their float16 and
    bfloat16 values, the first code in the low half; four float32 round into one word as each
    alone does, the first in byte 0."""
    rng = np.random.default_rng(8)
    codes = np.arange(256, dtype=np.uint8)
    grid = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    finite = np.sort(grid[np.isfinite(grid)])
    ties = (finite[:-1] + finite[1:]) / 2  # exactly between neighbouring codes
    x = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-3, 3, 200), ties,
                        [448.0, 460.0, 464.0, 1e6, -1e30, np.inf, -np.inf, np.nan, 0.0, -0.0,
                         2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11]]).astype(np.float32)
    bits = np.zeros(len(x), np.uint8)
    decoded = np.full(256, np.nan, np.float32)
    rcp = np.zeros(len(x), np.float32)
    pairs = (codes.astype(np.uint16) | (codes[::-1].astype(np.uint16) << 8)).astype(np.uint16)
    f16x2, bf16x2 = np.zeros(256, np.uint32), np.zeros(256, np.uint32)
    quads = np.zeros(len(x) // 4, np.uint32)
    kernel = cuda.jit(K.fp8_conversions()[0])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        kernel[2, 32](x, bits, codes, decoded, rcp, pairs, f16x2, bf16x2, quads)
        np.testing.assert_array_equal(quads.view(np.uint8), bits[:4 * len(quads)])
        for words, dtype in ((f16x2, np.float16), (bf16x2, ml_dtypes.bfloat16)):
            halves = words.view(np.uint16).reshape(256, 2).view(dtype).astype(np.float32)
            for half, source in ((0, codes), (1, codes[::-1])):
                want = source.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
                np.testing.assert_array_equal(halves[:, half], want)  # (NaN equals NaN here)
        want = np.where(np.isnan(x), x, np.clip(x, -448.0, 448.0)).astype(ml_dtypes.float8_e4m3fn)
        np.testing.assert_array_equal(decoded[np.isfinite(grid)], grid[np.isfinite(grid)])
        assert np.isnan(decoded[~np.isfinite(grid)]).all()
        np.testing.assert_array_equal(bits[~np.isnan(x)], want.view(np.uint8)[~np.isnan(x)])
        assert np.isnan(bits[np.isnan(x)].view(ml_dtypes.float8_e4m3fn).astype(np.float32)).all()
        ref = 1.0 / x.astype(np.float64)
        ok = np.isfinite(ref) & (np.abs(ref) < 1e38) & (np.abs(ref) > 2.0 ** -126)
        np.testing.assert_allclose(rcp[ok], ref[ok], rtol=2.0 ** -22, atol=0)


_PROBE = str(pathlib.Path(K.__file__).resolve()) + ":probe"


def test_fp8_conversions_compile_for_hopper():
    (text, report), = ptxcheck.compile_reports_isolated([(_PROBE, (9, 0), ("fp8_conversions",))])
    for needle in ("cvt.rn.f16x2.e4m3x2", "cvt.rn.satfinite.e4m3x2.f32", "rcp.approx.ftz.f32"):
        assert needle in text, f"no {needle!r} in the PTX"
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report["log"]


def test_ptx_compiles_without_spills():
    (text, report), = ptxcheck.compile_reports_isolated([(_PROBE, (9, 0), ("conversions",))])
    what = "('conversions',) at sm_90"
    for needle in ("cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32", "ex2.approx.ftz.f32"):
        assert needle in text, f"{what}: no {needle!r} in the PTX"
    assert "ld.local" not in text and "st.local" not in text, what
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (what, report["log"])
    assert report["stack"] == 0, (what, report["log"])
    assert 0 < report["registers"] <= 128, (what, report["registers"])
