"""An independent NumPy model of the mma.sync fragments (PTX ISA, mma.m16n8k16 / ldmatrix), written
from the ISA's formulas and not from ``kernels/ptx``: the instruction tests check against it."""

import ml_dtypes
import numpy as np

FMTS = ["float16", "bfloat16"]
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def to_bits(x, fmt):
    return np.asarray(x, np.float32).astype(NP[fmt]).view(np.uint16)


def from_bits(bits, fmt):
    return np.asarray(bits, np.uint16).view(NP[fmt]).astype(np.float64)


def pair(lo, hi):
    return np.uint32(int(lo) | (int(hi) << 16))


def frag_a(A):
    """(16, 16) uint16 -> (32, 4) uint32: a0..a7 of every lane, two per register."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = [A[g, 2 * t], A[g, 2 * t + 1], A[g + 8, 2 * t], A[g + 8, 2 * t + 1],
             A[g, 2 * t + 8], A[g, 2 * t + 9], A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9]]
        out[lane] = [pair(a[2 * i], a[2 * i + 1]) for i in range(4)]
    return out


def frag_b(B):
    """(16, 8) uint16 (k x n) -> (32, 2) uint32: b0..b3 of every lane."""
    out = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane] = [pair(B[2 * t, g], B[2 * t + 1, g]), pair(B[2 * t + 8, g], B[2 * t + 9, g])]
    return out


def frag_c(C):
    """(16, 8) float -> (32, 4) float32: c0..c3 of every lane."""
    out = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    return out


def unfrag_c(frags):
    """Inverse of ``frag_c``."""
    C = np.full((16, 8), np.nan)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = frags[lane]
    return C


def assert_f32_product(out, A, B, C=None, what="", rel=4e-6):
    """``out`` (float32 accumulate) against the float64 product: within ``rel`` (a few float32
    ulps) of the magnitude sum |A| @ |B| + |C|."""
    C = np.zeros((A.shape[0], B.shape[1])) if C is None else C
    ref = A @ B + C
    bound = rel * (np.abs(A) @ np.abs(B) + np.abs(C)) + 1e-30
    err = np.abs(out - ref)
    assert not np.isnan(out).any(), what + ": NaN"
    assert (err <= bound).all(), \
        f"{what}: max err {err.max():.3g}, worst ratio {(err / bound).max():.3g}"
