"""Storage formats: how a kernel specialised for ``fmt`` stores its elements and reads them.

Kernels see float16 and bfloat16 tensors as ``uint16`` bit patterns (``runtime/arrays.py`` makes the
views), so one kernel body serves both formats: a load widens the bits to float32 and a store
rounds float32 to nearest-even bits, each one instruction (``instructions.convert``). float32
storage needs no conversion at all. float8_e4m3fn arrives as ``uint8`` bits, converted the same
way (sm_89 and later; a store saturates to +-448).

    storage_type(fmt)   Numba element type of the arrays a kernel for ``fmt`` receives
    loader(fmt)         device function: one stored element -> float32
    storer(fmt)         device function: float32 -> one stored element
"""

from numba import cuda, float32, types

from ..instructions import convert


@cuda.jit(device=True, inline="always")
def _f32_identity(x):
    return float32(x)


def loader(fmt):
    """Device function turning one stored element of format ``fmt`` into float32."""
    return {"float16": convert.f16_to_f32, "bfloat16": convert.bf16_to_f32,
            "float8_e4m3fn": convert.e4m3_to_f32, "float32": _f32_identity}[fmt]


def storer(fmt):
    """Device function rounding a float32 to one stored element of format ``fmt``."""
    return {"float16": convert.f32_to_f16, "bfloat16": convert.f32_to_bf16,
            "float8_e4m3fn": convert.f32_to_e4m3, "float32": _f32_identity}[fmt]


def storage_type(fmt):
    """Numba element type of the arrays a kernel specialised for ``fmt`` receives."""
    return {"float32": types.float32, "float8_e4m3fn": types.uint8}.get(fmt, types.uint16)
