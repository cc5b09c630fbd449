"""Scalar primitives every kernel family shares: 16-bit float storage and warp shuffles.

Storage. Kernels see float16 and bfloat16 tensors as ``uint16`` bit patterns (``arrays.py`` makes
the views), so one kernel body serves both formats: a load widens the bits to float32 and a store
rounds float32 to nearest-even bits. On a GPU each conversion is one PTX ``cvt`` instruction (or a
shift for bfloat16 -> float32, whose bits are the top half of a float32); float32 storage needs no
conversion at all.

Shuffles. ``shfl_xor`` lets the lanes of a warp swap registers without shared memory (used for row
reductions of the online softmax). Numba's CUDA simulator has no warp shuffles, so there the same
call exchanges values through a shared scratch array between two ``syncthreads``: every thread of
the block must make the call together, which the kernels guarantee by calling it outside any
thread-dependent branch.

Every GPU primitive has its simulator emulation chosen here, once, at import time.
"""

import math

import numpy as np
from numba import config, cuda, float32, types

SIMULATOR = bool(config.ENABLE_CUDASIM)

LOG2E = np.float32(1.4426950408889634)  # exp(x) == exp2(x * LOG2E)
LN2 = np.float32(0.6931471805599453)
NEG_INF = np.float32(-math.inf)
POS_INF = np.float32(math.inf)

# Storage formats a kernel factory is specialised for (see arrays.py for the dtype mapping).
FORMATS = ("float16", "bfloat16", "float32")


def scratch_size(threads):
    """Elements of the float32 scratch array ``shfl_xor`` needs: one per thread under the
    simulator, a single unused word on a GPU (shuffles need no memory there)."""
    return threads if SIMULATOR else 1


if SIMULATOR:
    # Simulator device functions must go through cuda.jit so that ``cuda`` inside them is the
    # simulator's module (syncthreads is a real barrier between the Python threads).

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

    @cuda.jit(device=True)
    def shfl_xor(value, lane_mask, scratch, tid):
        cuda.syncthreads()
        scratch[tid] = value
        cuda.syncthreads()
        other = scratch[tid ^ lane_mask]
        return other

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f16_to_f32(typingctx, bits):
        if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]),
                               "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, args)

        return float32(bits), codegen

    @intrinsic
    def bf16_to_f32(typingctx, bits):
        if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
            return None

        def codegen(context, builder, sig, args):
            wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
            return builder.bitcast(wide, ir.FloatType())

        return float32(bits), codegen

    def _f32_to_16(instruction):
        @intrinsic
        def convert(typingctx, x):
            if not isinstance(x, types.Float) or x.bitwidth != 32:
                return None

            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                                   instruction + " $0, $1;", "=h,f")
                return builder.call(asm, args)

            return types.uint16(x), codegen

        return convert

    f32_to_f16 = _f32_to_16("cvt.rn.f16.f32")
    f32_to_bf16 = _f32_to_16("cvt.rn.bf16.f32")

    @cuda.jit(device=True, inline="always")
    def shfl_xor(value, lane_mask, scratch, tid):
        return cuda.shfl_xor_sync(0xFFFFFFFF, value, lane_mask)


@cuda.jit(device=True, inline="always")
def _f32_identity(x):
    return float32(x)


def loader(fmt):
    """Device function turning one stored element of format ``fmt`` into float32."""
    return {"float16": f16_to_f32, "bfloat16": bf16_to_f32, "float32": _f32_identity}[fmt]


def storer(fmt):
    """Device function rounding a float32 to one stored element of format ``fmt``."""
    return {"float16": f32_to_f16, "bfloat16": f32_to_bf16, "float32": _f32_identity}[fmt]


def storage_type(fmt):
    """Numba element type of the arrays a kernel specialised for ``fmt`` receives."""
    return types.float32 if fmt == "float32" else types.uint16
