"""The mma.sync and ldmatrix instructions of kernels/ptx/mma.py: fragment layouts, ldmatrix
(x4, x2, .trans) and the full cp.async -> ldmatrix -> mma -> pack pipeline of one tile.

Simulator: the emulations must give what the PTX ISA says the instructions give, so every check
here is against an independent NumPy construction of the fragments (``_fragments.py``, written
from the ISA's formulas, not from kernels/ptx). GPU: the same tests run the real instructions,
and one more compares them with the emulations on random inputs. No GPU and no simulator needed:
the PTX test compiles the kernels in a child process and checks the instructions and the register
report.
"""

import functools
import pathlib

import numpy as np
import pytest
from numba import cuda

from helpers import SIMULATOR
from numba_flash.runtime import ptxcheck
from numba_flash.kernels.ptx import model

from kernels.ptx import _ptx_kernels as K
from kernels.ptx._fragments import (FMTS, NP, assert_f32_product, frag_a, frag_b, frag_c,
                        from_bits, pair, to_bits, unfrag_c)


@functools.lru_cache(maxsize=None)
def _jit(name, *args):
    pyfunc, _ = getattr(K, name)(*args)
    return cuda.jit(pyfunc)


# ---- simulator and GPU: the instructions against the ISA's fragment layouts ------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_mma_fragments(fmt):
    """mma on fragments built from the ISA's layout tables; one independent tile per warp."""
    rng = np.random.default_rng(1)
    a_words = np.zeros((K.THREADS, 4), np.uint32)
    b_words = np.zeros((K.THREADS, 2), np.uint32)
    c = np.zeros((K.THREADS, 4), np.float32)
    tiles = []
    for w in range(K.WARPS):
        A = to_bits(rng.standard_normal((16, 16)), fmt)
        B = to_bits(rng.standard_normal((16, 8)), fmt)
        C = rng.standard_normal((16, 8)).astype(np.float32)
        lanes = slice(32 * w, 32 * w + 32)
        a_words[lanes], b_words[lanes], c[lanes] = frag_a(A), frag_b(B), frag_c(C)
        tiles.append((A, B, C))
    d = np.full((K.THREADS, 4), np.nan, np.float32)
    _jit("fragment_mma", fmt)[1, K.THREADS](a_words, b_words, c, d)
    for w, (A, B, C) in enumerate(tiles):
        lanes = slice(32 * w, 32 * w + 32)
        D = unfrag_c(d[lanes])
        assert_f32_product(D, from_bits(A, fmt), from_bits(B, fmt), C.astype(np.float64),
                           f"warp {w}")
        emulated = model.emulate_mma(a_words[lanes], b_words[lanes], c[lanes], fmt)
        np.testing.assert_allclose(d[lanes], emulated, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FMTS)
def test_ldmatrix_cp_async_mma_tiles(fmt):
    """cp.async -> shared -> ldmatrix (x4, x4.trans, x2, x2.trans) -> mma, and P reused from
    registers as the A operand: S = A K^T, A V and round(S) V for one 16x16 tile per warp."""
    rng = np.random.default_rng(2)
    valid_rows = 13  # rows 13..15 of V are zero-filled by cp.async
    a = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    kt = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    v = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    s_out, av_out, pv_out = (np.full((K.WARPS, 16, 16), np.nan, np.float32) for _ in range(3))
    regs = np.zeros((K.THREADS, 16), np.uint32)
    _jit("tiles", fmt)[1, K.THREADS](a, kt, v, np.int32(valid_rows), s_out, av_out, pv_out, regs)

    v0 = v.copy()
    v0[:, valid_rows:, :] = 0
    for w in range(K.WARPS):
        lanes = slice(32 * w, 32 * w + 32)
        A, Kt, V = from_bits(a[w], fmt), from_bits(kt[w], fmt), from_bits(v0[w], fmt)
        # ldmatrix with the documented lane addresses yields exactly the mma fragments.
        np.testing.assert_array_equal(regs[lanes, 0:4], frag_a(a[w]))
        np.testing.assert_array_equal(regs[lanes, 4:6], frag_b(kt[w].T[:, 0:8]))
        np.testing.assert_array_equal(regs[lanes, 6:8], frag_b(kt[w].T[:, 8:16]))
        np.testing.assert_array_equal(regs[lanes, 8:10], frag_b(v0[w][:, 0:8]))
        np.testing.assert_array_equal(regs[lanes, 10:12], frag_b(v0[w][:, 8:16]))
        np.testing.assert_array_equal(regs[lanes, 12:14], regs[lanes, 4:6])  # x2 = x4[:2]
        np.testing.assert_array_equal(regs[lanes, 14:16], regs[lanes, 8:10])
        assert_f32_product(s_out[w].astype(np.float64), A, Kt.T, what=f"S warp {w}")
        assert_f32_product(av_out[w].astype(np.float64), A, V, what=f"AV warp {w}")
        P = s_out[w].astype(NP[fmt]).astype(np.float64)  # the kernel's S, rounded (RNE)
        assert_f32_product(pv_out[w].astype(np.float64), P, V, what=f"PV warp {w}")


def test_ldmatrix_emulation_model():
    """``emulate_ldmatrix`` (host model, also the GPU reference) on scattered row addresses."""
    rng = np.random.default_rng(3)
    flat = rng.integers(0, 1 << 16, size=64 * 8, dtype=np.uint16)
    rows = rng.permutation(64)[:32]
    offsets = rows * 8
    M = flat.reshape(64, 8)
    for num in (2, 4):
        for trans in (False, True):
            got = model.emulate_ldmatrix(flat, offsets, num, trans)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for j in range(num):
                    mat = M[rows[8 * j:8 * j + 8]]  # matrix j: rows from lanes 8j..8j+7
                    if trans:
                        mat = mat.T
                    assert got[lane, j] == pair(mat[g, 2 * t], mat[g, 2 * t + 1])


# ---- no GPU needed: the PTX and what ptxas makes of it -------------------------------------

_PROBE = str(pathlib.Path(K.__file__).resolve()) + ":probe"


def test_ptx_compiles_without_spills():
    jobs = [(_PROBE, (8, 0), ("tiles", "float16")),
            (_PROBE, (9, 0), ("tiles", "float16")),
            (_PROBE, (8, 0), ("tiles", "bfloat16")),
            (_PROBE, (9, 0), ("tiles", "bfloat16"))]
    results = ptxcheck.compile_reports_isolated(jobs)
    for (_, cc, args), (text, report) in zip(jobs, results):
        what = f"{args} at sm_{cc[0]}{cc[1]}"
        ab = "f16" if args[1] == "float16" else "bf16"
        for needle in (f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32",
                       "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                       "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                       "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                       "cp.async.cg.shared.global", "cp.async.commit_group",
                       "cp.async.wait_group 1;", "cp.async.wait_group 0;",
                       f"cvt.rn.{ab}x2.f32", ".shared .align 16"):
            assert needle in text, f"{what}: no {needle!r} in the PTX"
        assert "ld.local" not in text and "st.local" not in text, what
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (what, report["log"])
        assert report["stack"] == 0, (what, report["log"])
        assert 0 < report["registers"] <= 128, (what, report["registers"])


# ---- GPU only: real instructions against the emulations on random inputs ---------------------

def _random_bits(rng, shape, fmt):
    """Random finite 16-bit floats spanning many binades (normal and subnormal)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
    if fmt == "float16":
        bits &= 0xBBFF  # exponent < 0b01111: |x| < 1, no Inf/NaN, subnormals included
    else:
        # sign and mantissa random, biased exponent 112 ^ (0..31) = 80..127: |x| in [2^-47, 2),
        # so every product is a normal float32 and the sums stay finite
        bits = (bits & 0x807F) | 0x3800
        bits ^= rng.integers(0, 32, size=shape, dtype=np.uint16) << 7
    return bits


@pytest.mark.skipif(SIMULATOR, reason="needs a GPU: compares the real instructions")
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_matches_emulation(fmt):
    rng = np.random.default_rng(6)
    kernel = _jit("fragment_mma", fmt)
    for _ in range(20):
        a_bits = _random_bits(rng, (K.THREADS, 8), fmt)
        b_bits = _random_bits(rng, (K.THREADS, 4), fmt)
        a_words = a_bits.view(np.uint32).reshape(K.THREADS, 4).copy()
        b_words = b_bits.view(np.uint32).reshape(K.THREADS, 2).copy()
        c = rng.standard_normal((K.THREADS, 4)).astype(np.float32)
        d = np.full((K.THREADS, 4), np.nan, np.float32)
        kernel[1, K.THREADS](a_words, b_words, c, d)
        for w in range(K.WARPS):
            lanes = slice(32 * w, 32 * w + 32)
            emulated = model.emulate_mma(a_words[lanes], b_words[lanes], c[lanes], fmt)
            # Error bound from the magnitudes: emulate with |A|, |B|, |C|.
            abs_a = (a_bits[lanes] & 0x7FFF).view(np.uint32).reshape(32, 4)
            abs_b = (b_bits[lanes] & 0x7FFF).view(np.uint32).reshape(32, 2)
            scale = model.emulate_mma(abs_a, abs_b, np.abs(c[lanes]), fmt).astype(np.float64)
            err = np.abs(d[lanes].astype(np.float64) - emulated)
            assert (err <= 4e-6 * scale + 1e-37).all(), (w, err.max())
