"""The warpgroup instructions of kernels/ptx/wgmma.py: swizzled shared layout, descriptors, wgmma.

Every check is against an independent NumPy construction from the PTX ISA ("Asynchronous
Warpgroup Level Matrix Shared Memory Layout", "Register Fragments"): the 128-byte swizzle and the
accumulator layout are written out here, not taken from kernels/ptx. Simulator: the emulations; a
Hopper GPU: the real instructions. Any machine: the PTX for sm_90a, checked for wgmma, no spills
and no serialization warning.
"""

import functools
import pathlib

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from helpers import SIMULATOR
from numba_flash.runtime import ptxcheck

from kernels.ptx import _wgmma_kernels as W
from kernels.ptx._fragments import FMTS, assert_f32_product, frag_a, from_bits, to_bits


def hopper():
    return not SIMULATOR and cuda.get_current_device().compute_capability == (9, 0)


needs_wgmma = pytest.mark.skipif(not SIMULATOR and not hopper(),
                                 reason="wgmma runs on compute capability 9.0 only")


def swizzled_image(M, rows):
    """Shared-memory image (flat uint16) of M (rows x cols, cols a multiple of 64): column
    blocks of 64 elements, 128-byte rows, 16-byte chunk c of row r stored at chunk c ^ (r % 8)."""
    cols = M.shape[1]
    img = np.zeros(rows * cols, np.uint16)
    for r in range(rows):
        for c in range(cols):
            block, chunk, e = c // 64, (c % 64) // 8, c % 8
            img[block * rows * 64 + r * 64 + 8 * (chunk ^ (r % 8)) + e] = M[r, c]
    return img


def accumulator_regs(D):
    """(64, n) -> (128, n / 2): thread 32 w + lane, register 4 i + e holds
    D[16 w + lane // 4 + 8 (e // 2), 8 i + 2 (lane % 4) + e % 2]."""
    n = D.shape[1]
    regs = np.zeros((128, n // 2), D.dtype)
    for tid in range(128):
        w, g, t = tid // 32, (tid % 32) // 4, tid % 4
        for i in range(n // 8):
            for e in range(4):
                regs[tid, 4 * i + e] = D[16 * w + g + 8 * (e // 2), 8 * i + 2 * t + e % 2]
    return regs


def swizzled_bytes(M):
    """Shared-memory image (flat uint16 words) of the 8-bit matrix M (rows x 128): 128-byte
    rows, 16-byte chunk c of row r stored at chunk c ^ (r % 8)."""
    rows = M.shape[0]
    img = np.zeros(rows * 128, np.uint8)
    for r in range(rows):
        for c in range(128):
            img[r * 128 + 16 * ((c // 16) ^ (r % 8)) + c % 16] = M[r, c]
    return img.view(np.uint16)


def frag_a_e4m3(A):
    """(16, 32) uint8 -> (32, 4) uint32: register r of lane (g, t) holds row g + 8 (r % 2),
    columns 4 t + 16 (r // 2) .. + 3, the lowest column in byte 0."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in range(4):
            row, col = g + 8 * (r % 2), 4 * t + 16 * (r // 2)
            out[lane, r] = int.from_bytes(bytes(A[row, col:col + 4]), "little")
    return out


@functools.lru_cache(maxsize=None)
def _jit(*args):
    return cuda.jit(W.chain(*args)[0])


@needs_wgmma
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("a_regs,trans_b,n", [(False, 0, 64), (True, 1, 128), (False, 1, 64),
                                              (True, 0, 64)])
@pytest.mark.parametrize("accumulate", [1, 0])
def test_chain_of_four_k_steps(fmt, a_regs, trans_b, n, accumulate):
    """D = A B + C (or A B: the first k-step's scale-d false) over K = 64 in four wgmma: Q K^T
    is (A from shared, B K-major), P V is (A from registers, B MN-major)."""
    rng = np.random.default_rng(7)
    A = to_bits(rng.standard_normal((64, W.K)), fmt)
    B = to_bits(rng.standard_normal((W.K, n)), fmt)  # [k][n]
    C = rng.standard_normal((64, n)).astype(np.float32)
    a_img = swizzled_image(A, 64)
    b_img = swizzled_image(B, W.K) if trans_b else swizzled_image(np.ascontiguousarray(B.T), n)
    a_frag = np.zeros((128, W.K // 16, 4), np.uint32)
    for w in range(4):
        for ks in range(W.K // 16):
            a_frag[32 * w:32 * w + 32, ks] = frag_a(A[16 * w:16 * w + 16, 16 * ks:16 * ks + 16])
    d = np.full((128, n // 2), np.nan, np.float32)
    _jit(fmt, n, a_regs, trans_b)[1, 128](a_img, b_img, a_frag, accumulator_regs(C), d,
                                          np.int32(accumulate))
    D = np.full((64, n), np.nan)
    D_regs = accumulator_regs(np.arange(64 * n).reshape(64, n))  # where each register lands
    D.reshape(-1)[D_regs.reshape(-1)] = d.reshape(-1)
    assert_f32_product(D, from_bits(A, fmt), from_bits(B, fmt),
                       C.astype(np.float64) if accumulate else None, f"{fmt} n{n}")


@needs_wgmma
@pytest.mark.parametrize("a_regs,n", [(False, 64), (True, 128)])
def test_e4m3_chain_of_four_k_steps(a_regs, n):
    """FP8: D = A B + C over K = 128 e4m3 in four k32 wgmma, both operands K-major (B stored as
    B^T), A from shared memory or from registers (the 8-bit fragment layout)."""
    rng = np.random.default_rng(9)
    e4m3 = ml_dtypes.float8_e4m3fn
    A = (rng.standard_normal((64, 128)) * 4).astype(e4m3).view(np.uint8)
    B = (rng.standard_normal((128, n)) * 4).astype(e4m3).view(np.uint8)  # [k][n]
    C = rng.standard_normal((64, n)).astype(np.float32)
    a_frag = np.zeros((128, 4, 4), np.uint32)
    for w in range(4):
        for ks in range(4):
            a_frag[32 * w:32 * w + 32, ks] = frag_a_e4m3(A[16 * w:16 * w + 16, 32 * ks:32 * ks + 32])
    d = np.full((128, n // 2), np.nan, np.float32)
    _jit("float8_e4m3fn", n, a_regs, 0)[1, 128](swizzled_bytes(A),
                                                swizzled_bytes(np.ascontiguousarray(B.T)), a_frag,
                                                accumulator_regs(C), d, np.int32(1))
    D = np.full((64, n), np.nan)
    D.reshape(-1)[accumulator_regs(np.arange(64 * n).reshape(64, n)).reshape(-1)] = d.reshape(-1)
    f64 = lambda x: x.view(e4m3).astype(np.float64)  # noqa: E731
    # Hopper's FP8 tensor cores keep about 14 bits of the running sum (DeepSeek-V3's report):
    # an H100 gives errors up to 2^-12.6 of the magnitude sum, where 16-bit inputs stay within
    # float32's few ulps. A fragment in the wrong place errs by the magnitude itself.
    assert_f32_product(D, f64(A), f64(B), C.astype(np.float64), f"e4m3 n{n}", rel=2.0 ** -11)


_CHAIN = str(pathlib.Path(W.__file__).resolve()) + ":chain"


def test_ptx_for_sm90a_has_wgmma_and_no_spills():
    jobs = [(_CHAIN, (9, 0, "a"), (fmt, n, a_regs, trans_b))
            for fmt, n, a_regs, trans_b in [("float16", 64, False, 0), ("bfloat16", 128, True, 1),
                                            ("float8_e4m3fn", 64, False, 0),
                                            ("float8_e4m3fn", 128, True, 0)]]
    for (_, _, (fmt, n, a_regs, trans_b)), (text, report) in zip(
            jobs, ptxcheck.compile_reports_isolated(jobs)):
        ab, k = {"float16": ("f16", 16), "bfloat16": ("bf16", 16), "float8_e4m3fn": ("e4m3", 32)}[fmt]
        for needle in (f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ab}.{ab}",
                       "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                       "wgmma.wait_group.sync.aligned 0", "fence.proxy.async.shared::cta"):
            assert needle in text, f"{fmt} n{n}: no {needle!r}"
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report["log"]
        assert "C7509" not in report["log"], report["log"]  # wgmma serialized
