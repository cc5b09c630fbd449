"""The simulator's ``convert``: 16- and 8-bit <-> float32 conversions, packing, ex2, rcp and 32-bit
division (``kernels/ptx/convert.py`` has the instructions and the API), computed with NumPy.

Rounding matches the GPU's: float32 -> float16 through NumPy's (nearest even) cast, float32 ->
bfloat16 by the integer rounding ``cvt.rn.bf16.f32`` performs, NaN staying a quiet NaN, e4m3
through ml_dtypes (nearest even) after saturating to +-448 as ``satfinite`` does. Only
``exp2_approx`` and ``rcp_approx`` differ, by design: they are correctly rounded here
(``ex2.approx`` is within 2 ulp, ``rcp.approx`` within 1) and flush subnormal results to zero
like ``.ftz``.

Simulator device functions must go through ``cuda.jit`` so that ``cuda`` inside them is the
simulator's module.
"""

import math

import ml_dtypes
import numpy as np
from numba import cuda, float32


# ---- one 16-bit value <-> float32 --------------------------------------------------------------

@cuda.jit(device=True)
def f16_to_f32(bits):
    return float32(np.array(bits, dtype=np.uint16).view(np.float16))


@cuda.jit(device=True)
def bf16_to_f32(bits):
    return float32(np.array(np.uint32(bits) << np.uint32(16), dtype=np.uint32).view(np.float32))


@cuda.jit(device=True)
def f32_to_f16(x):
    return np.array(np.float16(np.float32(x))).view(np.uint16)[()]


@cuda.jit(device=True)
def f32_to_bf16(x):
    u = int(np.array(np.float32(x)).view(np.uint32))
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN stays a (quiet) NaN
        return np.uint16((u >> 16) | 0x40)
    u += 0x7FFF + ((u >> 16) & 1)  # round to nearest, ties to even
    return np.uint16((u >> 16) & 0xFFFF)


# ---- one 8-bit float (e4m3) <-> float32 ---------------------------------------------------------

E4M3_MAX = np.float32(448.0)


@cuda.jit(device=True)
def e4m3_to_f32(bits):
    return float32(np.array(bits, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))


@cuda.jit(device=True)
def f32_to_e4m3(x):
    x = np.float32(x)
    if not math.isnan(x):  # satfinite: past the range, the largest finite value
        x = min(max(x, -E4M3_MAX), E4M3_MAX)
    return np.array(x).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[()]


@cuda.jit(device=True)
def pack_e4m3x4(x0, x1, x2, x3):
    """Four float32 rounded to e4m3 (as ``f32_to_e4m3``) in one uint32, ``x0`` in byte 0."""
    return np.uint32(int(f32_to_e4m3(x0)) | (int(f32_to_e4m3(x1)) << 8)
                     | (int(f32_to_e4m3(x2)) << 16) | (int(f32_to_e4m3(x3)) << 24))


@cuda.jit(device=True)
def bits_to_f32(bits):
    """A 32-bit word read as the float32 it holds."""
    return np.array(int(bits) & 0xFFFFFFFF, np.uint32).view(np.float32)[()]


# ---- two 8-bit floats (e4m3) -> two 16-bit floats, exactly ------------------------------------

@cuda.jit(device=True)
def e4m3x2_to_f16x2(bits):
    """Two e4m3 bytes (uint16, byte 0 low) as two float16 in one uint32."""
    bits = int(bits)
    return pack_f16x2(e4m3_to_f32(np.uint8(bits & 0xFF)), e4m3_to_f32(np.uint8(bits >> 8)))


@cuda.jit(device=True)
def e4m3x2_to_bf16x2(bits):
    """Two e4m3 bytes (uint16, byte 0 low) as two bfloat16 in one uint32."""
    bits = int(bits)
    return pack_bf16x2(e4m3_to_f32(np.uint8(bits & 0xFF)), e4m3_to_f32(np.uint8(bits >> 8)))


def widen_e4m3x2(fmt):
    """The two-e4m3 -> 16-bit pair widening for ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": e4m3x2_to_f16x2, "bfloat16": e4m3x2_to_bf16x2}[fmt]


# ---- two 16-bit values in one register ---------------------------------------------------------

@cuda.jit(device=True)
def pack_f16x2(lo, hi):
    """Round two float32 to float16 (nearest even) and pack them: ``lo`` in bits 0-15."""
    return np.uint32(int(f32_to_f16(lo)) | (int(f32_to_f16(hi)) << 16))


@cuda.jit(device=True)
def pack_bf16x2(lo, hi):
    """Round two float32 to bfloat16 (nearest even) and pack them: ``lo`` in bits 0-15."""
    return np.uint32(int(f32_to_bf16(lo)) | (int(f32_to_bf16(hi)) << 16))


@cuda.jit(device=True)
def unpack_f16x2(r):
    """The two float16 of a packed register as float32: (bits 0-15, bits 16-31)."""
    r = int(r)
    return f16_to_f32(np.uint16(r & 0xFFFF)), f16_to_f32(np.uint16(r >> 16))


@cuda.jit(device=True)
def unpack_bf16x2(r):
    """The two bfloat16 of a packed register as float32: (bits 0-15, bits 16-31)."""
    r = int(r)
    return bf16_to_f32(np.uint16(r & 0xFFFF)), bf16_to_f32(np.uint16(r >> 16))


def pack(fmt):
    """The float32-pair packing device function for ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": pack_f16x2, "bfloat16": pack_bf16x2}[fmt]


def unpack(fmt):
    """The packed-pair -> two float32 device function for ``fmt``."""
    return {"float16": unpack_f16x2, "bfloat16": unpack_bf16x2}[fmt]


# ---- arithmetic --------------------------------------------------------------------------------

@cuda.jit(device=True)
def exp2_approx(x):
    """2**x in float32 (correctly rounded here; ``ex2.approx.ftz.f32`` on a GPU)."""
    with np.errstate(over="ignore", under="ignore"):
        y = np.float32(np.exp2(np.float32(x)))
    if math.isfinite(y) and abs(y) < np.float32(1.1754944e-38):
        y = np.float32(0.0)  # .ftz: subnormal results flush to zero
    return y


@cuda.jit(device=True)
def rcp_approx(x):
    """1 / x in float32 (correctly rounded here; ``rcp.approx.ftz.f32`` on a GPU)."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        y = np.float32(np.float32(1.0) / np.float32(x))
    if math.isfinite(y) and abs(y) < np.float32(1.1754944e-38):
        y = np.float32(0.0)  # .ftz
    return y


@cuda.jit(device=True)
def div_rn(a, b):
    """``a / b`` of two float32, correctly rounded."""
    return np.float32(np.float32(a) / np.float32(b))


@cuda.jit(device=True)
def div_u32(a, b):
    """``a // b`` of two non-negative 32-bit integers."""
    return np.uint32(int(a) // int(b))
