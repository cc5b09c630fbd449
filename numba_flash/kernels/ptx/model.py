"""The instructions' semantics in NumPy, one warp (or one descriptor) at a time.

The simulator's emulations (``kernels/emulation``) compute with these, and the GPU tests compare
the real instructions against them on the same inputs. Host code only: nothing here runs inside
a kernel on a GPU.

    bits_to_f64(bits, fmt)                        bit patterns -> float64 values
    warp_a_tile(a_words, fmt)                     the 16 x k A tile of a warp's A fragments
    warp_tiles(a_words, b_words, fmt)             the A and B tiles of a warp's fragments
    lane_mma(A, B, c, lane)                       one lane's D registers of D = A B + C
    emulate_mma(a_words, b_words, c, fmt)         D registers of a whole warp
    lane_ldmatrix(flat, offsets, lane, num, trans), emulate_ldmatrix(flat, offsets, num, trans)
    read_operand(flat, desc, rows, fmt, mn_major) the matrix a wgmma descriptor names

The fragment tables these follow are in ``kernels/ptx/mma.py``'s docstring, the swizzle in
``kernels/ptx/wgmma.py``'s.
"""

import ml_dtypes
import numpy as np

from .layout import E4M3

_LANE = np.arange(32)[:, None]
_GROUP, _IN_GROUP = _LANE >> 2, _LANE & 3
_I8 = np.arange(8)[None, :]  # a0..a7
_A_ROW = _GROUP + 8 * ((_I8 >> 1) & 1)  # (32, 8): row of A that lane's a_i holds
_A_COL = 2 * _IN_GROUP + (_I8 & 1) + 8 * (_I8 >> 2)
_I16 = np.arange(16)[None, :]  # the 16 bytes of an 8-bit A fragment, register r = i >> 2
_A8_ROW = _GROUP + 8 * ((_I16 >> 2) & 1)
_A8_COL = 4 * _IN_GROUP + (_I16 & 3) + 16 * (_I16 >> 3)
_I4 = np.arange(4)[None, :]  # b0..b3 and c0..c3
_B_ROW = 2 * _IN_GROUP + (_I4 & 1) + 8 * (_I4 >> 1)  # (32, 4): row (k) of B that b_i holds
_B_COL = _GROUP + 0 * _I4
_C_ROW = _GROUP + 8 * (_I4 >> 1)  # (32, 4): row of C/D that c_i holds
_C_COL = 2 * _IN_GROUP + (_I4 & 1)


def bits_to_f64(bits, fmt):
    """Bit patterns of format ``fmt`` (uint16; uint8 for float8_e4m3fn) -> float64 values."""
    if fmt == E4M3:
        return np.asarray(bits, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def _bytes(words):
    """(lanes, n) 32-bit registers -> (lanes, 4n) bytes, each lowest byte first."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    return words.view(np.uint8).reshape(words.shape[0], -1)  # little-endian, as the GPU


def _halves(words):
    """(lanes, n) 32-bit registers -> (lanes, 2n) 16-bit values, each low half first."""
    words = np.asarray(words, dtype=np.uint32)
    pairs = np.stack([words & np.uint32(0xFFFF), words >> np.uint32(16)], axis=-1)
    return pairs.reshape(words.shape[0], -1).astype(np.uint16)


# ---- mma.sync.m16n8k16 -------------------------------------------------------------------------

def warp_a_tile(a_words, fmt):
    """The 16 x k A tile (float64) held by a warp's A fragments ``a_words (32, 4)``: k 16 for
    16-bit formats (mma.m16n8k16), 32 for e4m3 (wgmma's k32 slab of a warp, mma.py's layout with
    four bytes where two halves were)."""
    if fmt == E4M3:
        A = np.zeros((16, 32), np.float64)
        A[_A8_ROW, _A8_COL] = bits_to_f64(_bytes(a_words), fmt)
        return A
    A = np.zeros((16, 16), np.float64)
    A[_A_ROW, _A_COL] = bits_to_f64(_halves(a_words), fmt)  # a0..a7 of each lane
    return A


def warp_tiles(a_words, b_words, fmt):
    """The 16x16 A and 16x8 B tiles (float64) held by a warp's A and B fragments."""
    B = np.zeros((16, 8), np.float64)
    B[_B_ROW, _B_COL] = bits_to_f64(_halves(b_words), fmt)  # b0..b3 of each lane
    return warp_a_tile(a_words, fmt), B


def lane_mma(A, B, c, lane):
    """The four D registers of ``lane`` for D = A B + c."""
    # Products of 16-bit floats are exact in float64 and the 16-term sums nearly so: one rounding
    # to float32 at the end, an ideal float32-accumulating tensor core.
    rows, cols = _C_ROW[lane], _C_COL[lane]
    return tuple(np.float32(np.dot(A[rows[i]], B[:, cols[i]]) + np.float64(c[i]))
                 for i in range(4))


def emulate_mma(a_words, b_words, c, fmt):
    """What ``mma_f16`` / ``mma_bf16`` return for a whole warp: ``a_words (32, 4)`` and
    ``b_words (32, 2)`` uint32 registers, ``c (32, 4)`` float32, row = lane -> ``(32, 4)``."""
    A, B = warp_tiles(a_words, b_words, fmt)
    return np.array([lane_mma(A, B, c[lane], lane) for lane in range(32)], np.float32)


# ---- ldmatrix ----------------------------------------------------------------------------------

def lane_ldmatrix(flat, offsets, lane, num, trans):
    """The ``num`` registers ``lane`` receives when lane ``i`` gives the row at ``offsets[i]``."""
    g, t = lane >> 2, lane & 3
    out = []
    for j in range(num):
        if trans:  # M_j[2t][g], M_j[2t + 1][g]
            lo = flat[int(offsets[8 * j + 2 * t]) + g]
            hi = flat[int(offsets[8 * j + 2 * t + 1]) + g]
        else:  # M_j[g][2t], M_j[g][2t + 1]
            start = int(offsets[8 * j + g]) + 2 * t
            lo, hi = flat[start], flat[start + 1]
        out.append(np.uint32(int(lo) | (int(hi) << 16)))
    return tuple(out)


def emulate_ldmatrix(flat, offsets, num, trans):
    """What ``ldmatrix_x{num}[_trans]`` returns for a whole warp reading the 16-bit array
    ``flat`` when lane ``i`` passes ``offsets[i]`` -> ``(32, num)`` uint32."""
    return np.array([lane_ldmatrix(flat, offsets, lane, num, trans) for lane in range(32)],
                    np.uint32)


# ---- wgmma operands as the hardware reads them -------------------------------------------------

def _swizzle(address):
    return address ^ (((address >> 7) & 7) << 4)


def read_operand(flat, desc, rows, fmt, mn_major):
    """The operand a descriptor names, from the 16-bit array ``flat`` whose byte offsets stand
    for shared addresses: K-major -> (rows, k) [mn][k]; MN-major -> (k, rows) [k][mn]; k 16,
    or 32 for e4m3 (K-major only)."""
    desc = int(desc)
    if desc >> 62 != 1:
        raise ValueError("only the 128-byte swizzle layout is emulated")
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    mn = np.arange(rows)[:, None]
    if fmt == E4M3:
        assert not mn_major, "8-bit operands are K-major"
        address = start + (mn % 8) * 128 + (mn // 8) * sbo + np.arange(32)[None, :]
        return bits_to_f64(np.asarray(flat).view(np.uint8)[_swizzle(address)], fmt)
    k = np.arange(16)[None, :]
    if mn_major:
        address = start + 2 * (mn % 64) + (mn // 64) * lbo + (k % 8) * 128 + (k // 8) * sbo
    else:
        address = start + (mn % 8) * 128 + (mn // 8) * sbo + 2 * k
    values = bits_to_f64(np.asarray(flat)[_swizzle(address) >> 1], fmt)
    return values.T if mn_major else values
